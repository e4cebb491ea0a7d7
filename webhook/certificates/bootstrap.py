"""Self-signed TLS for the admission webhooks without cert-manager, idempotent (docs/deployment.md): a CA,
a serving certificate and the webhooks' `caBundle`, written only when missing, expiring or wrong; a renewed
CA is trusted before anything it signed is served; `--restart-deployment` rolls the webhook after a change."""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import hashlib
import ipaddress
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from webhook.certificates.tls import generate_ca, generate_serving_cert

DEFAULT_SERVICE = "gpu-timekeeper-webhook"
DEFAULT_TLS_SECRET = "gpu-timekeeper-webhook-tls"
DEFAULT_CA_SECRET = "gpu-timekeeper-webhook-ca"
DEFAULT_WEBHOOK_CONFIGURATION = "gpu-timekeeper"
DEFAULT_RENEW_BEFORE_DAYS = 30
SERVING_CERT_DAYS = 365
CA_COMMON_NAME = "gpu-timekeeper-webhook-ca"
SERVING_CERT_ANNOTATION = "gpu-timekeeper.io/serving-cert-sha256"
SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
MAX_ATTEMPTS = 5

CA_CERT_KEY = "ca.crt"
CA_KEY_KEY = "ca.key"
TLS_CERT_KEY = "tls.crt"
TLS_KEY_KEY = "tls.key"


class Change(StrEnum):
    UNCHANGED = "unchanged"
    CREATED = "created"
    RENEWED = "renewed"


@dataclass(frozen=True)
class Target:
    """What to keep valid: names of the Service, the Secrets and the webhook configurations."""

    namespace: str
    service: str = DEFAULT_SERVICE
    tls_secret: str = DEFAULT_TLS_SECRET
    ca_secret: str = DEFAULT_CA_SECRET
    webhook_configurations: tuple[tuple[str, str], ...] = (
        ("mutating", DEFAULT_WEBHOOK_CONFIGURATION),
        ("validating", DEFAULT_WEBHOOK_CONFIGURATION),
    )
    extra_sans: tuple[str, ...] = ()
    renew_before: dt.timedelta = dt.timedelta(days=DEFAULT_RENEW_BEFORE_DAYS)

    @property
    def required_names(self) -> frozenset[str]:
        """The name the API server dials (`<service>.<namespace>.svc`) plus any extra SANs asked for."""
        return frozenset({f"{self.service}.{self.namespace}.svc", *map(_normalise_san, self.extra_sans)})


def _normalise_san(name: str) -> str:
    """IP addresses in canonical form, so `::1` and `0:0::1` are the same SAN; DNS names as given."""
    try:
        return ipaddress.ip_address(name).compressed
    except ValueError:
        return name


@dataclass(frozen=True)
class Stored:
    """A Secret's data as read, with the version to replace it against (None: it does not exist)."""

    data: dict[str, bytes]
    version: str | None


class Conflict(Exception):
    """Somebody else wrote the same object between our read and our write; start over."""


class CertificateStore(Protocol):
    """Where the Secrets and the caBundles live: the Kubernetes API, or a directory."""

    def read_secret(self, name: str) -> Stored: ...

    def write_secret(self, name: str, data: dict[str, bytes], previous: Stored) -> None: ...

    def ca_bundle_matches(self, kind: str, name: str, bundle: bytes) -> bool: ...

    def patch_ca_bundle(self, kind: str, name: str, bundle: bytes) -> None: ...


@dataclass(frozen=True)
class Result:
    ca: Change
    serving: Change
    patched_webhook_configurations: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return self.ca is not Change.UNCHANGED or self.serving is not Change.UNCHANGED

    def as_dict(self) -> dict[str, Any]:
        return {
            "event": "webhook_certificates",
            "ca": str(self.ca),
            "serving": str(self.serving),
            "patched_webhook_configurations": list(self.patched_webhook_configurations),
        }


def _load_cert(pem: bytes | None) -> x509.Certificate | None:
    try:
        return x509.load_pem_x509_certificate(pem) if pem else None
    except ValueError:
        return None


def _key_matches(cert: x509.Certificate, key_pem: bytes | None) -> bool:
    if not key_pem:
        return False
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return False
    spki = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    return key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)


def _lasts(cert: x509.Certificate, now: dt.datetime, renew_before: dt.timedelta) -> bool:
    return cert.not_valid_before_utc <= now and cert.not_valid_after_utc - now > renew_before


def usable_ca(
    cert_pem: bytes | None, key_pem: bytes | None, now: dt.datetime, renew_before: dt.timedelta
) -> bool:
    """A CA we may keep signing with: parses, is a CA, has its key, and does not expire soon."""
    cert = _load_cert(cert_pem)
    if cert is None or not _key_matches(cert, key_pem) or not _lasts(cert, now, renew_before):
        return False
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def usable_serving_cert(
    cert_pem: bytes | None, key_pem: bytes | None, ca_pem: bytes, target: Target, now: dt.datetime
) -> bool:
    """A serving certificate we may keep: its key, signed by the current CA, all names, not expiring soon."""
    cert, ca = _load_cert(cert_pem), _load_cert(ca_pem)
    if cert is None or ca is None or not _key_matches(cert, key_pem):
        return False
    if not _lasts(cert, now, target.renew_before):
        return False
    try:
        cert.verify_directly_issued_by(ca)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, x509.ExtensionNotFound, InvalidSignature):
        return False
    present = {*sans.get_values_for_type(x509.DNSName)}
    present |= {ip.compressed for ip in sans.get_values_for_type(x509.IPAddress)}
    return target.required_names <= present


def _split_pem_bundle(bundle: bytes) -> list[bytes]:
    try:
        return [c.public_bytes(serialization.Encoding.PEM) for c in x509.load_pem_x509_certificates(bundle)]
    except ValueError:
        return []


def trust_bundle(ca_pem: bytes, previous_bundle: bytes, now: dt.datetime) -> bytes:
    """The current CA first, then every other CA of the previous bundle that has not expired yet."""
    kept = [ca_pem]
    for pem in _split_pem_bundle(previous_bundle):
        cert = _load_cert(pem)
        if pem not in kept and cert is not None and cert.not_valid_after_utc > now:
            kept.append(pem)
    return b"".join(kept)


def ensure_once(store: CertificateStore, target: Target, now: dt.datetime) -> Result:
    """One read-decide-write pass; raises Conflict when a concurrent writer got there first."""
    ca_secret = store.read_secret(target.ca_secret)
    ca_pem, ca_key = ca_secret.data.get(CA_CERT_KEY), ca_secret.data.get(CA_KEY_KEY)
    ca_change = Change.UNCHANGED
    if not usable_ca(ca_pem, ca_key, now, target.renew_before):
        ca_change = Change.CREATED if ca_secret.version is None else Change.RENEWED
        ca_pem, ca_key = generate_ca(CA_COMMON_NAME)
        store.write_secret(target.ca_secret, {CA_CERT_KEY: ca_pem, CA_KEY_KEY: ca_key}, ca_secret)
    assert ca_pem is not None and ca_key is not None

    tls_secret = store.read_secret(target.tls_secret)
    bundle = trust_bundle(ca_pem, tls_secret.data.get(CA_CERT_KEY, b""), now)
    # The caBundle first: by the time a certificate of a new CA is served, the API server trusts it.
    patched = []
    for kind, name in target.webhook_configurations:
        if not store.ca_bundle_matches(kind, name, bundle):
            store.patch_ca_bundle(kind, name, bundle)
            patched.append(f"{kind}/{name}")

    cert_pem, key_pem = tls_secret.data.get(TLS_CERT_KEY), tls_secret.data.get(TLS_KEY_KEY)
    serving_change = Change.UNCHANGED
    if not usable_serving_cert(cert_pem, key_pem, ca_pem, target, now):
        serving_change = Change.RENEWED if cert_pem else Change.CREATED
        cert_pem, key_pem = generate_serving_cert(
            ca_pem,
            ca_key,
            target.service,
            target.namespace,
            extra_sans=target.extra_sans,
            days=SERVING_CERT_DAYS,
        )
    assert cert_pem is not None and key_pem is not None
    tls_data = {TLS_CERT_KEY: cert_pem, TLS_KEY_KEY: key_pem, CA_CERT_KEY: bundle}
    if tls_data != tls_secret.data:
        store.write_secret(target.tls_secret, tls_data, tls_secret)
    return Result(ca_change, serving_change, tuple(patched))


def ensure(store: CertificateStore, target: Target, now: dt.datetime | None = None) -> Result:
    """Bring CA, serving certificate and caBundles to a valid state; safe to run concurrently."""
    when = now or dt.datetime.now(dt.UTC)
    for _ in range(MAX_ATTEMPTS - 1):
        with contextlib.suppress(Conflict):
            return ensure_once(store, target, when)
    return ensure_once(store, target, when)


class DirectoryStore:
    """Each Secret is a folder of files under `root`; there are no webhook configurations to patch."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read_secret(self, name: str) -> Stored:
        folder = self.root / name
        if not folder.is_dir():
            return Stored({}, None)
        return Stored({p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}, "files")

    def write_secret(self, name: str, data: dict[str, bytes], previous: Stored) -> None:
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        for key, value in data.items():
            path = folder / key
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_bytes(value)
            # Private keys readable by the owner only; certificates by anyone.
            tmp.chmod(0o600 if key.endswith(".key") else 0o644)
            tmp.replace(path)

    def ca_bundle_matches(self, kind: str, name: str, bundle: bytes) -> bool:
        return True

    def patch_ca_bundle(self, kind: str, name: str, bundle: bytes) -> None:
        raise NotImplementedError("a directory has no webhook configurations")


class KubernetesStore:
    """Secrets in one namespace and the caBundle of named webhook configurations, via the official client."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        from kubernetes import client

        self._client = client
        self.namespace = namespace
        self.core = client.CoreV1Api(api_client)
        self.admission = client.AdmissionregistrationV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)

    def read_secret(self, name: str) -> Stored:
        try:
            secret = self.core.read_namespaced_secret(name, self.namespace)
        except self._client.ApiException as error:
            if error.status == 404:
                return Stored({}, None)
            raise
        data = {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}
        return Stored(data, secret.metadata.resource_version)

    def write_secret(self, name: str, data: dict[str, bytes], previous: Stored) -> None:
        body = self._client.V1Secret(
            api_version="v1",
            kind="Secret",
            metadata=self._client.V1ObjectMeta(
                name=name,
                namespace=self.namespace,
                resource_version=previous.version,
                labels={"app.kubernetes.io/part-of": "gpu-timekeeper"},
            ),
            type="kubernetes.io/tls" if TLS_CERT_KEY in data else "Opaque",
            data={key: base64.b64encode(value).decode() for key, value in data.items()},
        )
        try:
            if previous.version is None:
                self.core.create_namespaced_secret(self.namespace, body)
            else:
                self.core.replace_namespaced_secret(name, self.namespace, body)
        except self._client.ApiException as error:
            if error.status == 409:
                raise Conflict(name) from error
            raise

    def _read_configuration(self, kind: str, name: str) -> Any:
        if kind == "mutating":
            return self.admission.read_mutating_webhook_configuration(name)
        return self.admission.read_validating_webhook_configuration(name)

    def ca_bundle_matches(self, kind: str, name: str, bundle: bytes) -> bool:
        webhooks = self._read_configuration(kind, name).webhooks or []
        return all(w.client_config.ca_bundle == base64.b64encode(bundle).decode() for w in webhooks)

    def patch_ca_bundle(self, kind: str, name: str, bundle: bytes) -> None:
        """A JSON patch per webhook, each guarded by a test of its name so a reordering cannot misfire."""
        webhooks = self._read_configuration(kind, name).webhooks or []
        encoded = base64.b64encode(bundle).decode()
        patch: list[dict[str, Any]] = []
        for index, webhook in enumerate(webhooks):
            patch.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook.name})
            patch.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded})
        if not patch:
            return
        if kind == "mutating":
            self.admission.patch_mutating_webhook_configuration(name, patch)
        else:
            self.admission.patch_validating_webhook_configuration(name, patch)

    def restart_if_changed(self, deployment: str, tls_secret: str) -> bool:
        """Roll the Deployment when its pods were started with another certificate than the Secret holds.

        False when nothing changed, the Secret is not there yet, or the Deployment does not exist (yet).
        """
        certificate = self.read_secret(tls_secret).data.get(TLS_CERT_KEY)
        if certificate is None:
            return False
        fingerprint = hashlib.sha256(certificate).hexdigest()
        try:
            current = self.apps.read_namespaced_deployment(deployment, self.namespace)
        except self._client.ApiException as error:
            if error.status == 404:
                return False
            raise
        if (current.spec.template.metadata.annotations or {}).get(SERVING_CERT_ANNOTATION) == fingerprint:
            return False
        annotations = {SERVING_CERT_ANNOTATION: fingerprint}
        body = {"spec": {"template": {"metadata": {"annotations": annotations}}}}
        self.apps.patch_namespaced_deployment(deployment, self.namespace, body)
        return True


def _default_namespace() -> str | None:
    if namespace := os.environ.get("POD_NAMESPACE"):
        return namespace
    if SERVICE_ACCOUNT_NAMESPACE_FILE.is_file():
        return SERVICE_ACCOUNT_NAMESPACE_FILE.read_text().strip()
    return None


def _api_client(kubeconfig: str | None) -> Any:
    from kubernetes import client, config

    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config(config_file=kubeconfig)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m webhook.certbootstrap", description="Self-signed TLS for the admission webhooks."
    )
    parser.add_argument("--namespace", default=_default_namespace(), help="the webhook Service's namespace")
    parser.add_argument("--service", default=DEFAULT_SERVICE)
    parser.add_argument("--tls-secret", default=DEFAULT_TLS_SECRET)
    parser.add_argument("--ca-secret", default=DEFAULT_CA_SECRET)
    parser.add_argument("--mutating-webhook-configuration", default=DEFAULT_WEBHOOK_CONFIGURATION)
    parser.add_argument("--validating-webhook-configuration", default=DEFAULT_WEBHOOK_CONFIGURATION)
    parser.add_argument("--extra-san", action="append", default=[], help="another DNS name (repeatable)")
    parser.add_argument("--renew-before-days", type=int, default=DEFAULT_RENEW_BEFORE_DAYS)
    parser.add_argument(
        "--restart-deployment", help="Deployment to restart when the serving certificate changed"
    )
    parser.add_argument(
        "--external-issuer",
        action="store_true",
        help="another issuer (cert-manager) keeps the certificate: only --restart-deployment",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else ~/.kube/config)")
    parser.add_argument(
        "--output-dir", type=Path, help="write <dir>/<secret>/<key> files instead of talking to a cluster"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.namespace:
        print("certbootstrap: --namespace is required outside a pod", file=sys.stderr)
        return 2
    configurations = tuple(
        (kind, name)
        for kind, name in (
            ("mutating", args.mutating_webhook_configuration),
            ("validating", args.validating_webhook_configuration),
        )
        if name
    )
    target = Target(
        namespace=args.namespace,
        service=args.service,
        tls_secret=args.tls_secret,
        ca_secret=args.ca_secret,
        webhook_configurations=() if args.output_dir else configurations,
        extra_sans=tuple(args.extra_san),
        renew_before=dt.timedelta(days=args.renew_before_days),
    )
    if args.output_dir:
        if args.external_issuer or args.restart_deployment:
            print("certbootstrap: --output-dir has no issuer or Deployment to work with", file=sys.stderr)
            return 2
        print(json.dumps(ensure(DirectoryStore(args.output_dir), target).as_dict()))
        return 0
    with _api_client(args.kubeconfig) as api_client:
        store = KubernetesStore(api_client, args.namespace)
        summary: dict[str, Any] = {"event": "webhook_certificates", "issuer": "external"}
        if not args.external_issuer:
            summary = ensure(store, target).as_dict()
        if args.restart_deployment:
            summary["restarted"] = store.restart_if_changed(args.restart_deployment, args.tls_secret)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
