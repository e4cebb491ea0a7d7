"""`python -m webhook.certbootstrap` against a real API server, as its own ServiceAccount with the RBAC
components/selfsigned-bootstrap ships. The layer's fixture already ran it once (the webhook serves the
certificate it issued); these tests check what it left and that it repairs a caBundle gone wrong."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from kubernetes import client

from tests.cluster.conftest import (
    INSTALL_NAMESPACE,
    WebhookTls,
    run_certbootstrap,
    service_account_kubeconfig,
)
from tests.cluster.harness import Kubectl, admits, gpu_probe
from tests.support.control_plane import ControlPlane
from tests.support.processes import wait_until
from webhook.certificates.tls import generate_ca

KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")


@pytest.fixture
def bootstrap_kubeconfig(control_plane: ControlPlane, core: client.CoreV1Api, tmp_path: Path) -> Path:
    return service_account_kubeconfig(control_plane, core, "gpu-timekeeper-certbootstrap", tmp_path)


def ca_bundles(kubectl: Kubectl) -> dict[str, bytes]:
    return {
        kind: base64.b64decode(
            kubectl.json("get", kind, "gpu-timekeeper")["webhooks"][0]["clientConfig"]["caBundle"]
        )
        for kind in KINDS
    }


def test_both_configurations_trust_the_ca_in_the_bootstrap_secret(
    kubectl: Kubectl, core: client.CoreV1Api, webhook_tls: WebhookTls, bootstrap_kubeconfig: Path
) -> None:
    secret = core.read_namespaced_secret("gpu-timekeeper-webhook-ca", INSTALL_NAMESPACE)
    ca = base64.b64decode(secret.data["ca.crt"])

    again = json.loads(run_certbootstrap(bootstrap_kubeconfig))

    assert ca_bundles(kubectl) == {kind: ca for kind in KINDS}
    assert webhook_tls.ca == ca
    assert again == {
        "event": "webhook_certificates",
        "ca": "unchanged",
        "serving": "unchanged",
        "patched_webhook_configurations": [],
    }


def test_a_wrong_ca_bundle_is_repaired_and_admission_works_again(
    kubectl: Kubectl, namespace: str, bootstrap_kubeconfig: Path
) -> None:
    """A caBundle that does not sign the webhook's certificate: the API server refuses to call it (and,
    with failurePolicy Fail, refuses the pod); the bootstrap puts the right one back."""
    stranger, _ = generate_ca("not the webhook's CA")
    wrong = json.dumps(
        [
            {
                "op": "replace",
                "path": "/webhooks/0/clientConfig/caBundle",
                "value": base64.b64encode(stranger).decode(),
            }
        ]
    )
    kubectl.run("patch", KINDS[0], "gpu-timekeeper", "--type=json", "-p", wrong)
    wait_until(
        lambda: not admits(kubectl, gpu_probe(namespace)),
        timeout=30,
        what="the API server to distrust the webhook",
    )
    refusal = kubectl.refusal(gpu_probe(namespace))

    repaired = json.loads(run_certbootstrap(bootstrap_kubeconfig))
    wait_until(
        lambda: admits(kubectl, gpu_probe(namespace)),
        timeout=30,
        what="the API server to trust the webhook again",
    )

    assert "x509: certificate signed by unknown authority" in refusal
    assert repaired["patched_webhook_configurations"] == ["mutating/gpu-timekeeper"]
    assert (repaired["ca"], repaired["serving"]) == ("unchanged", "unchanged")
