"""The self-signed certificate bootstrap, run through its CLI against a stand-in API server."""

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

from tests.support.kube_stub_certs import FakeCluster, running_cluster, write_kubeconfig
from webhook import certbootstrap
from webhook.certbootstrap import Change, KubernetesStore, Target, ensure

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "gpu-timekeeper"
SERVICE = "gpu-timekeeper-webhook"
ARGS = ["--namespace", NAMESPACE, "--restart-deployment", "gpu-timekeeper-webhook"]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeCluster, Path]]:
    """The stand-in holding our real webhook configurations and webhook Deployment, as in deployment/."""
    with running_cluster() as (fake, url):
        for manifest in ("webhookconfigurations.yaml", "deployment.yaml"):
            for obj in yaml.safe_load_all((ROOT / "deployment/base/webhook" / manifest).read_text()):
                if obj["kind"] == "Deployment":
                    obj["metadata"]["namespace"] = NAMESPACE
                fake.put(obj)
        yield fake, write_kubeconfig(tmp_path / "kubeconfig", url)


def run(kubeconfig: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    assert certbootstrap.main([*ARGS, "--kubeconfig", str(kubeconfig), *extra]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def secret(fake: FakeCluster, name: str) -> dict[str, bytes]:
    data = fake.get("Secret", NAMESPACE, name)["data"]
    return {key: base64.b64decode(value) for key, value in data.items()}


def ca_bundles(fake: FakeCluster) -> list[bytes]:
    return [
        base64.b64decode(webhook["clientConfig"]["caBundle"])
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for webhook in fake.get(kind, "", "gpu-timekeeper")["webhooks"]
    ]


def rolled_out_with(fake: FakeCluster) -> str | None:
    """The serving certificate fingerprint the webhook pods were last restarted for."""
    template = fake.get("Deployment", NAMESPACE, "gpu-timekeeper-webhook")["spec"]["template"]
    return template["metadata"].get("annotations", {}).get(certbootstrap.SERVING_CERT_ANNOTATION)


def fingerprint(fake: FakeCluster) -> str:
    return hashlib.sha256(secret(fake, "gpu-timekeeper-webhook-tls")["tls.crt"]).hexdigest()


def test_first_run_creates_a_ca_and_a_serving_cert_the_api_server_will_trust(cluster, capsys):
    fake, kubeconfig = cluster

    summary = run(kubeconfig, capsys)

    assert summary["ca"] == "created" and summary["serving"] == "created"
    tls = secret(fake, "gpu-timekeeper-webhook-tls")
    assert fake.get("Secret", NAMESPACE, "gpu-timekeeper-webhook-tls")["type"] == "kubernetes.io/tls"
    ca = x509.load_pem_x509_certificate(secret(fake, "gpu-timekeeper-webhook-ca")["ca.crt"])
    serving = x509.load_pem_x509_certificate(tls["tls.crt"])
    serving.verify_directly_issued_by(ca)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{SERVICE}.{NAMESPACE}.svc" in sans.get_values_for_type(x509.DNSName)
    assert ca_bundles(fake) == [tls["ca.crt"], tls["ca.crt"]]
    assert x509.load_pem_x509_certificates(tls["ca.crt"]) == [ca]
    assert "ca.key" not in tls


def test_second_run_changes_nothing(cluster, capsys):
    fake, kubeconfig = cluster
    run(kubeconfig, capsys)
    before = dict(fake.objects)
    fake.requests.clear()

    summary = run(kubeconfig, capsys)

    assert summary == {
        "event": "webhook_certificates",
        "ca": "unchanged",
        "serving": "unchanged",
        "patched_webhook_configurations": [],
        "restarted": False,
    }
    assert fake.writes() == []
    assert fake.objects == before


def test_a_reset_ca_bundle_is_patched_back(cluster, capsys):
    fake, kubeconfig = cluster
    run(kubeconfig, capsys)
    validating = fake.get("ValidatingWebhookConfiguration", "", "gpu-timekeeper")
    validating["webhooks"][0]["clientConfig"].pop("caBundle")
    fake.put(validating)

    summary = run(kubeconfig, capsys)

    assert summary["patched_webhook_configurations"] == ["validating/gpu-timekeeper"]
    assert summary["serving"] == "unchanged"
    assert len(set(ca_bundles(fake))) == 1


def test_a_serving_cert_near_expiry_is_renewed_under_the_same_ca_and_the_webhook_restarted(cluster):
    fake, kubeconfig = cluster
    with certbootstrap._api_client(str(kubeconfig)) as api:
        store = KubernetesStore(api, NAMESPACE)
        ensure(store, Target(NAMESPACE))
        old = secret(fake, "gpu-timekeeper-webhook-tls")
        expiry = x509.load_pem_x509_certificate(old["tls.crt"]).not_valid_after_utc

        result = ensure(store, Target(NAMESPACE), now=expiry - dt.timedelta(days=29))

    assert (result.ca, result.serving) == (Change.UNCHANGED, Change.RENEWED)
    assert result.patched_webhook_configurations == ()
    new = secret(fake, "gpu-timekeeper-webhook-tls")
    assert new["tls.crt"] != old["tls.crt"] and new["tls.key"] != old["tls.key"]
    assert new["ca.crt"] == old["ca.crt"]


def test_cli_restarts_the_deployment_only_when_the_serving_cert_changed(cluster, capsys):
    fake, kubeconfig = cluster
    assert run(kubeconfig, capsys)["restarted"] is True
    first = fingerprint(fake)
    assert rolled_out_with(fake) == first

    assert run(kubeconfig, capsys)["restarted"] is False
    assert rolled_out_with(fake) == first

    assert run(kubeconfig, capsys, "--extra-san", "other.example.internal")["restarted"] is True
    assert rolled_out_with(fake) == fingerprint(fake) != first


def test_with_an_external_issuer_it_only_restarts_the_webhook_when_the_certificate_changes(cluster, capsys):
    """cert-manager renews the Secret; the webhook must be restarted to serve the new certificate."""
    fake, kubeconfig = cluster
    external = ["--external-issuer"]
    assert run(kubeconfig, capsys, *external)["restarted"] is False  # no certificate issued yet

    ca_cert, ca_key = certbootstrap.generate_ca("cert-manager")
    for _ in range(2):
        cert, key = certbootstrap.generate_serving_cert(ca_cert, ca_key, SERVICE, NAMESPACE)
        tls = {"tls.crt": cert, "tls.key": key, "ca.crt": ca_cert}
        fake.put(
            {
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": {"name": "gpu-timekeeper-webhook-tls", "namespace": NAMESPACE},
                "data": {k: base64.b64encode(v).decode() for k, v in tls.items()},
            }
        )
        fake.requests.clear()

        assert run(kubeconfig, capsys, *external)["restarted"] is True
        assert rolled_out_with(fake) == hashlib.sha256(cert).hexdigest()
        assert run(kubeconfig, capsys, *external)["restarted"] is False

        written = {path for _, path in fake.writes()}
        assert written == {f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/gpu-timekeeper-webhook"}
    assert ("Secret", NAMESPACE, "gpu-timekeeper-webhook-ca") not in fake.objects


def test_a_ca_near_expiry_is_replaced_and_both_cas_are_trusted_until_the_old_one_expires(cluster):
    fake, kubeconfig = cluster
    with certbootstrap._api_client(str(kubeconfig)) as api:
        store = KubernetesStore(api, NAMESPACE)
        ensure(store, Target(NAMESPACE))
        old_ca = secret(fake, "gpu-timekeeper-webhook-ca")["ca.crt"]
        ca_expiry = x509.load_pem_x509_certificate(old_ca).not_valid_after_utc

        result = ensure(store, Target(NAMESPACE), now=ca_expiry - dt.timedelta(days=10))

    assert (result.ca, result.serving) == (Change.RENEWED, Change.RENEWED)
    new_ca = secret(fake, "gpu-timekeeper-webhook-ca")["ca.crt"]
    tls = secret(fake, "gpu-timekeeper-webhook-tls")
    assert tls["ca.crt"] == new_ca + old_ca
    assert set(ca_bundles(fake)) == {new_ca + old_ca}
    serving = x509.load_pem_x509_certificate(tls["tls.crt"])
    serving.verify_directly_issued_by(x509.load_pem_x509_certificate(new_ca))


def test_an_expired_old_ca_leaves_the_bundle():
    old_ca, _ = certbootstrap.generate_ca("old")
    new_ca, _ = certbootstrap.generate_ca("new")
    after_expiry = x509.load_pem_x509_certificate(old_ca).not_valid_after_utc + dt.timedelta(seconds=1)

    assert certbootstrap.trust_bundle(new_ca, old_ca, dt.datetime.now(dt.UTC)) == new_ca + old_ca
    assert certbootstrap.trust_bundle(new_ca, new_ca + old_ca, after_expiry) == new_ca


def test_a_new_name_reissues_the_serving_cert(cluster, capsys):
    fake, kubeconfig = cluster
    run(kubeconfig, capsys)

    summary = run(kubeconfig, capsys, "--extra-san", "webhook.example.internal")

    assert (summary["ca"], summary["serving"]) == ("unchanged", "renewed")
    serving = x509.load_pem_x509_certificate(secret(fake, "gpu-timekeeper-webhook-tls")["tls.crt"])
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "webhook.example.internal" in sans.get_values_for_type(x509.DNSName)


def test_a_serving_cert_whose_key_does_not_match_is_replaced(cluster, capsys):
    fake, kubeconfig = cluster
    run(kubeconfig, capsys)
    tls = fake.get("Secret", NAMESPACE, "gpu-timekeeper-webhook-tls")
    tls["data"]["tls.key"] = fake.get("Secret", NAMESPACE, "gpu-timekeeper-webhook-ca")["data"]["ca.key"]
    fake.put(tls)

    assert run(kubeconfig, capsys)["serving"] == "renewed"


def test_a_serving_cert_of_another_ca_with_the_same_name_is_replaced(cluster, capsys):
    """Someone replaced the CA Secret: the old serving cert's signature no longer verifies against it."""
    fake, kubeconfig = cluster
    run(kubeconfig, capsys)
    ca_cert, ca_key = certbootstrap.generate_ca(certbootstrap.CA_COMMON_NAME)
    ca = fake.get("Secret", NAMESPACE, "gpu-timekeeper-webhook-ca")
    ca["data"] = {"ca.crt": base64.b64encode(ca_cert).decode(), "ca.key": base64.b64encode(ca_key).decode()}
    fake.put(ca)

    summary = run(kubeconfig, capsys)

    assert (summary["ca"], summary["serving"]) == ("unchanged", "renewed")
    serving = x509.load_pem_x509_certificate(secret(fake, "gpu-timekeeper-webhook-tls")["tls.crt"])
    serving.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_cert))


def test_a_concurrent_writer_makes_the_bootstrap_start_over(cluster):
    """Two Jobs racing: the loser's replace answers 409 Conflict and it re-reads what the winner wrote."""
    fake, kubeconfig = cluster

    class RacingStore(KubernetesStore):
        raced = False

        def write_secret(self, name, data, previous):
            if name == "gpu-timekeeper-webhook-tls" and not self.raced:
                self.raced = True
                ensure(KubernetesStore(self.core.api_client, NAMESPACE), Target(NAMESPACE))
            super().write_secret(name, data, previous)

    with certbootstrap._api_client(str(kubeconfig)) as api:
        result = ensure(RacingStore(api, NAMESPACE), Target(NAMESPACE))

    assert result.serving is Change.UNCHANGED
    assert [m for m, p in fake.requests if m == "POST" and p.endswith("/secrets")] == ["POST", "POST", "POST"]
    tls = secret(fake, "gpu-timekeeper-webhook-tls")
    ca = secret(fake, "gpu-timekeeper-webhook-ca")
    x509.load_pem_x509_certificate(tls["tls.crt"]).verify_directly_issued_by(
        x509.load_pem_x509_certificate(ca["ca.crt"])
    )


def test_ip_address_sans_are_kept_across_runs(tmp_path, capsys):
    args = ["--namespace", NAMESPACE, "--output-dir", str(tmp_path), "--extra-san", "127.0.0.1"]
    assert certbootstrap.main(args) == 0
    assert certbootstrap.main(args) == 0

    first, second = (json.loads(line) for line in capsys.readouterr().out.strip().splitlines())
    assert (first["serving"], second["serving"]) == ("created", "unchanged")
    cert = x509.load_pem_x509_certificate((tmp_path / "gpu-timekeeper-webhook-tls" / "tls.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_output_dir_mode_refuses_cluster_only_options(tmp_path, capsys):
    args = ["--namespace", NAMESPACE, "--output-dir", str(tmp_path), "--restart-deployment", "x"]
    assert certbootstrap.main(args) == 2
    assert "--output-dir" in capsys.readouterr().err


def test_output_dir_mode_writes_files_once_without_a_cluster(tmp_path, capsys):
    args = ["--namespace", NAMESPACE, "--output-dir", str(tmp_path)]
    assert certbootstrap.main(args) == 0
    key = tmp_path / "gpu-timekeeper-webhook-tls" / "tls.key"
    written = key.read_bytes()

    assert certbootstrap.main(args) == 0

    outcome = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (outcome["ca"], outcome["serving"]) == ("unchanged", "unchanged")
    assert key.read_bytes() == written
    assert key.stat().st_mode & 0o077 == 0
    ca = x509.load_pem_x509_certificate((tmp_path / "gpu-timekeeper-webhook-ca" / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((tmp_path / "gpu-timekeeper-webhook-tls" / "tls.crt").read_bytes())
    cert.verify_directly_issued_by(ca)


def test_namespace_is_required_outside_a_pod(monkeypatch, capsys):
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setattr(certbootstrap, "SERVICE_ACCOUNT_NAMESPACE_FILE", Path("/nonexistent"))
    assert certbootstrap.main(["--output-dir", "/tmp/unused"]) == 2
    assert "--namespace" in capsys.readouterr().err
