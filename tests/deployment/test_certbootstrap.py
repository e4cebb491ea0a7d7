"""The self-signed certificate bootstrap, run through its CLI against the stand-in API server.

It runs with the token of the ServiceAccount deployment/ gives it, under the RBAC deployment/ ships, so a rule
missing there fails these tests as it would fail the Job.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from tests.support.kube_apiserver import Call, KubeApiServer
from webhook.certificates import bootstrap
from webhook.certificates.bootstrap import Change, KubernetesStore, Target, ensure

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "gpu-timekeeper"
SERVICE = "gpu-timekeeper-webhook"
ARGS = ["--namespace", NAMESPACE, "--restart-deployment", "gpu-timekeeper-webhook"]
ADMISSION = "admissionregistration.k8s.io/v1"
RBAC_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def manifests(relative: str, kinds: set[str] | None = None) -> list[dict[str, Any]]:
    objects = yaml.safe_load_all((ROOT / "deployment" / relative).read_text())
    return [o for o in objects if o and (kinds is None or o["kind"] in kinds)]


@pytest.fixture
def apiserver() -> Iterator[KubeApiServer]:
    """The stand-in holding our real webhook configurations and webhook Deployment, as in deployment/, and
    the RBAC of the bootstrap Job and of the cert-manager reload CronJob."""
    server = KubeApiServer().start()
    server.apply(manifests("base/webhook/webhookconfigurations.yaml"), NAMESPACE)
    server.apply(manifests("base/webhook/deployment.yaml"), NAMESPACE)
    server.apply(manifests("components/selfsigned-bootstrap/rbac.yaml", RBAC_KINDS), NAMESPACE)
    server.apply(manifests("components/certmanager/reload.yaml", RBAC_KINDS), NAMESPACE)
    yield server
    server.stop()


def kubeconfig_for(apiserver: KubeApiServer, path: Path, service_account: str) -> Path:
    token = apiserver.add_service_account_token(NAMESPACE, service_account)
    return apiserver.write_kubeconfig(path / f"{service_account}.kubeconfig", token)


@pytest.fixture
def kubeconfig(apiserver: KubeApiServer, tmp_path: Path) -> Path:
    """As the bootstrap Job's own ServiceAccount."""
    return kubeconfig_for(apiserver, tmp_path, "gpu-timekeeper-certbootstrap")


def run(kubeconfig: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    assert bootstrap.main([*ARGS, "--kubeconfig", str(kubeconfig), *extra]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def stored(apiserver: KubeApiServer, api_version: str, kind: str, name: str) -> dict[str, Any]:
    namespace = NAMESPACE if kind in ("Secret", "Deployment") else None
    obj = apiserver.get(api_version, kind, namespace, name)
    assert obj is not None, f"{kind} {name} not stored"
    return obj


def secret(apiserver: KubeApiServer, name: str) -> dict[str, bytes]:
    data = stored(apiserver, "v1", "Secret", name)["data"]
    return {key: base64.b64decode(value) for key, value in data.items()}


def ca_bundles(apiserver: KubeApiServer) -> list[bytes]:
    return [
        base64.b64decode(webhook["clientConfig"]["caBundle"])
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for webhook in stored(apiserver, ADMISSION, kind, "gpu-timekeeper")["webhooks"]
    ]


def rolled_out_with(apiserver: KubeApiServer) -> str | None:
    """The serving certificate fingerprint the webhook pods were last restarted for."""
    template = stored(apiserver, "apps/v1", "Deployment", "gpu-timekeeper-webhook")["spec"]["template"]
    return template["metadata"].get("annotations", {}).get(bootstrap.SERVING_CERT_ANNOTATION)


def fingerprint(apiserver: KubeApiServer) -> str:
    return hashlib.sha256(secret(apiserver, "gpu-timekeeper-webhook-tls")["tls.crt"]).hexdigest()


def test_first_run_creates_a_ca_and_a_serving_cert_the_api_server_will_trust(apiserver, kubeconfig, capsys):

    summary = run(kubeconfig, capsys)

    assert summary["ca"] == "created" and summary["serving"] == "created"
    tls = secret(apiserver, "gpu-timekeeper-webhook-tls")
    assert stored(apiserver, "v1", "Secret", "gpu-timekeeper-webhook-tls")["type"] == "kubernetes.io/tls"
    ca = x509.load_pem_x509_certificate(secret(apiserver, "gpu-timekeeper-webhook-ca")["ca.crt"])
    serving = x509.load_pem_x509_certificate(tls["tls.crt"])
    serving.verify_directly_issued_by(ca)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{SERVICE}.{NAMESPACE}.svc" in sans.get_values_for_type(x509.DNSName)
    # the pod, PodGroup and owner webhooks; validate and its sessions (exec, attach) webhook
    assert ca_bundles(apiserver) == [tls["ca.crt"]] * 5
    assert x509.load_pem_x509_certificates(tls["ca.crt"]) == [ca]
    assert "ca.key" not in tls


def test_second_run_changes_nothing(apiserver, kubeconfig, capsys):
    run(kubeconfig, capsys)
    before = apiserver.resource_version
    apiserver.calls.clear()

    summary = run(kubeconfig, capsys)

    assert summary == {
        "event": "webhook_certificates",
        "ca": "unchanged",
        "serving": "unchanged",
        "patched_webhook_configurations": [],
        "restarted": False,
    }
    assert apiserver.writes() == []
    assert {call.code for call in apiserver.calls} == {200}
    assert apiserver.resource_version == before  # no object changed at all


def test_a_reset_ca_bundle_is_patched_back(apiserver, kubeconfig, capsys):
    run(kubeconfig, capsys)
    validating = stored(apiserver, ADMISSION, "ValidatingWebhookConfiguration", "gpu-timekeeper")
    validating["webhooks"][0]["clientConfig"].pop("caBundle")
    apiserver.put(validating)

    summary = run(kubeconfig, capsys)

    assert summary["patched_webhook_configurations"] == ["validating/gpu-timekeeper"]
    assert summary["serving"] == "unchanged"
    assert len(set(ca_bundles(apiserver))) == 1


def test_a_serving_cert_near_expiry_is_renewed_under_the_same_ca_and_the_webhook_restarted(
    apiserver, kubeconfig
):
    with bootstrap._api_client(str(kubeconfig)) as api:
        store = KubernetesStore(api, NAMESPACE)
        ensure(store, Target(NAMESPACE))
        old = secret(apiserver, "gpu-timekeeper-webhook-tls")
        expiry = x509.load_pem_x509_certificate(old["tls.crt"]).not_valid_after_utc

        result = ensure(store, Target(NAMESPACE), now=expiry - dt.timedelta(days=29))

    assert (result.ca, result.serving) == (Change.UNCHANGED, Change.RENEWED)
    assert result.patched_webhook_configurations == ()
    new = secret(apiserver, "gpu-timekeeper-webhook-tls")
    assert new["tls.crt"] != old["tls.crt"] and new["tls.key"] != old["tls.key"]
    assert new["ca.crt"] == old["ca.crt"]


def test_cli_restarts_the_deployment_only_when_the_serving_cert_changed(apiserver, kubeconfig, capsys):
    assert run(kubeconfig, capsys)["restarted"] is True
    first = fingerprint(apiserver)
    assert rolled_out_with(apiserver) == first

    assert run(kubeconfig, capsys)["restarted"] is False
    assert rolled_out_with(apiserver) == first

    assert run(kubeconfig, capsys, "--extra-san", "other.example.internal")["restarted"] is True
    assert rolled_out_with(apiserver) == fingerprint(apiserver) != first


def test_with_an_external_issuer_it_only_restarts_the_webhook_when_the_certificate_changes(
    apiserver, tmp_path, capsys
):
    """cert-manager renews the Secret; the webhook must be restarted to serve the new certificate. Run as
    the reload CronJob's ServiceAccount, which may only read the Secret and restart the Deployment."""
    kubeconfig = kubeconfig_for(apiserver, tmp_path, "gpu-timekeeper-cert-reload")
    external = ["--external-issuer"]
    assert run(kubeconfig, capsys, *external)["restarted"] is False  # no certificate issued yet

    ca_cert, ca_key = bootstrap.generate_ca("cert-manager")
    for _ in range(2):
        cert, key = bootstrap.generate_serving_cert(ca_cert, ca_key, SERVICE, NAMESPACE)
        tls = {"tls.crt": cert, "tls.key": key, "ca.crt": ca_cert}
        apiserver.put(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": {"name": "gpu-timekeeper-webhook-tls", "namespace": NAMESPACE},
                "data": {k: base64.b64encode(v).decode() for k, v in tls.items()},
            }
        )
        apiserver.calls.clear()

        assert run(kubeconfig, capsys, *external)["restarted"] is True
        assert rolled_out_with(apiserver) == hashlib.sha256(cert).hexdigest()
        assert run(kubeconfig, capsys, *external)["restarted"] is False

        restart = Call("patch", "deployments", NAMESPACE, "gpu-timekeeper-webhook", 200)
        assert apiserver.writes() == [restart]
    assert apiserver.get("v1", "Secret", NAMESPACE, "gpu-timekeeper-webhook-ca") is None


def test_a_ca_near_expiry_is_replaced_and_both_cas_are_trusted_until_the_old_one_expires(
    apiserver, kubeconfig
):
    with bootstrap._api_client(str(kubeconfig)) as api:
        store = KubernetesStore(api, NAMESPACE)
        ensure(store, Target(NAMESPACE))
        old_ca = secret(apiserver, "gpu-timekeeper-webhook-ca")["ca.crt"]
        ca_expiry = x509.load_pem_x509_certificate(old_ca).not_valid_after_utc

        result = ensure(store, Target(NAMESPACE), now=ca_expiry - dt.timedelta(days=10))

    assert (result.ca, result.serving) == (Change.RENEWED, Change.RENEWED)
    new_ca = secret(apiserver, "gpu-timekeeper-webhook-ca")["ca.crt"]
    tls = secret(apiserver, "gpu-timekeeper-webhook-tls")
    assert tls["ca.crt"] == new_ca + old_ca
    assert set(ca_bundles(apiserver)) == {new_ca + old_ca}
    serving = x509.load_pem_x509_certificate(tls["tls.crt"])
    serving.verify_directly_issued_by(x509.load_pem_x509_certificate(new_ca))


def test_an_expired_old_ca_leaves_the_bundle():
    old_ca, _ = bootstrap.generate_ca("old")
    new_ca, _ = bootstrap.generate_ca("new")
    after_expiry = x509.load_pem_x509_certificate(old_ca).not_valid_after_utc + dt.timedelta(seconds=1)

    assert bootstrap.trust_bundle(new_ca, old_ca, dt.datetime.now(dt.UTC)) == new_ca + old_ca
    assert bootstrap.trust_bundle(new_ca, new_ca + old_ca, after_expiry) == new_ca


def test_a_new_name_reissues_the_serving_cert(apiserver, kubeconfig, capsys):
    run(kubeconfig, capsys)

    summary = run(kubeconfig, capsys, "--extra-san", "webhook.example.internal")

    assert (summary["ca"], summary["serving"]) == ("unchanged", "renewed")
    serving = x509.load_pem_x509_certificate(secret(apiserver, "gpu-timekeeper-webhook-tls")["tls.crt"])
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "webhook.example.internal" in sans.get_values_for_type(x509.DNSName)


def test_a_serving_cert_whose_key_does_not_match_is_replaced(apiserver, kubeconfig, capsys):
    run(kubeconfig, capsys)
    tls = stored(apiserver, "v1", "Secret", "gpu-timekeeper-webhook-tls")
    tls["data"]["tls.key"] = stored(apiserver, "v1", "Secret", "gpu-timekeeper-webhook-ca")["data"]["ca.key"]
    apiserver.put(tls)

    assert run(kubeconfig, capsys)["serving"] == "renewed"


def test_a_serving_cert_of_another_ca_with_the_same_name_is_replaced(apiserver, kubeconfig, capsys):
    """Someone replaced the CA Secret: the old serving cert's signature no longer verifies against it."""
    run(kubeconfig, capsys)
    ca_cert, ca_key = bootstrap.generate_ca(bootstrap.CA_COMMON_NAME)
    ca = stored(apiserver, "v1", "Secret", "gpu-timekeeper-webhook-ca")
    ca["data"] = {"ca.crt": base64.b64encode(ca_cert).decode(), "ca.key": base64.b64encode(ca_key).decode()}
    apiserver.put(ca)

    summary = run(kubeconfig, capsys)

    assert (summary["ca"], summary["serving"]) == ("unchanged", "renewed")
    serving = x509.load_pem_x509_certificate(secret(apiserver, "gpu-timekeeper-webhook-tls")["tls.crt"])
    serving.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_cert))


def test_a_concurrent_writer_makes_the_bootstrap_start_over(apiserver, kubeconfig):
    """Two Jobs racing: the loser's replace answers 409 Conflict and it re-reads what the winner wrote."""

    class RacingStore(KubernetesStore):
        raced = False

        def write_secret(self, name, data, previous):
            if name == "gpu-timekeeper-webhook-tls" and not self.raced:
                self.raced = True
                ensure(KubernetesStore(self.core.api_client, NAMESPACE), Target(NAMESPACE))
            super().write_secret(name, data, previous)

    with bootstrap._api_client(str(kubeconfig)) as api:
        result = ensure(RacingStore(api, NAMESPACE), Target(NAMESPACE))

    assert result.serving is Change.UNCHANGED
    creates = [c for c in apiserver.calls if (c.verb, c.resource) == ("create", "secrets")]
    assert [c.code for c in creates] == [201, 201, 409]  # the CA, the winner's cert, the loser's cert
    tls = secret(apiserver, "gpu-timekeeper-webhook-tls")
    ca = secret(apiserver, "gpu-timekeeper-webhook-ca")
    x509.load_pem_x509_certificate(tls["tls.crt"]).verify_directly_issued_by(
        x509.load_pem_x509_certificate(ca["ca.crt"])
    )


def test_ip_address_sans_are_kept_across_runs(tmp_path, capsys):
    args = ["--namespace", NAMESPACE, "--output-dir", str(tmp_path), "--extra-san", "127.0.0.1"]
    assert bootstrap.main(args) == 0
    assert bootstrap.main(args) == 0

    first, second = (json.loads(line) for line in capsys.readouterr().out.strip().splitlines())
    assert (first["serving"], second["serving"]) == ("created", "unchanged")
    cert = x509.load_pem_x509_certificate((tmp_path / "gpu-timekeeper-webhook-tls" / "tls.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_output_dir_mode_refuses_cluster_only_options(tmp_path, capsys):
    args = ["--namespace", NAMESPACE, "--output-dir", str(tmp_path), "--restart-deployment", "x"]
    assert bootstrap.main(args) == 2
    assert "--output-dir" in capsys.readouterr().err


def test_output_dir_mode_writes_files_once_without_a_cluster(tmp_path, capsys):
    args = ["--namespace", NAMESPACE, "--output-dir", str(tmp_path)]
    assert bootstrap.main(args) == 0
    key = tmp_path / "gpu-timekeeper-webhook-tls" / "tls.key"
    written = key.read_bytes()

    assert bootstrap.main(args) == 0

    outcome = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (outcome["ca"], outcome["serving"]) == ("unchanged", "unchanged")
    assert key.read_bytes() == written
    assert key.stat().st_mode & 0o077 == 0
    ca = x509.load_pem_x509_certificate((tmp_path / "gpu-timekeeper-webhook-ca" / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((tmp_path / "gpu-timekeeper-webhook-tls" / "tls.crt").read_bytes())
    cert.verify_directly_issued_by(ca)


def test_namespace_is_required_outside_a_pod(monkeypatch, capsys):
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setattr(bootstrap, "SERVICE_ACCOUNT_NAMESPACE_FILE", Path("/nonexistent"))
    assert bootstrap.main(["--output-dir", "/tmp/unused"]) == 2
    assert "--namespace" in capsys.readouterr().err
