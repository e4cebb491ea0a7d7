"""The shipped webhook configurations as a real API server runs them: re-invocation after another mutating
webhook, failurePolicy when our webhook cannot be reached, and each configuration's own settings.

The tests that change a configuration put it back before they end (the layer shares one install).
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuaccounting import names
from tests.cluster.harness import Kubectl, KubectlError, admits, gpu_probe
from tests.support.loopback import LoopbackServer, send_json
from tests.support.pods import container, pod
from tests.support.processes import REPO_ROOT, free_port, wait_until
from webhook.certificates.tls import generate_ca, generate_serving_cert

KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
SECOND_MUTATOR_LABEL = "gtk-test/second-mutator"
HELPER = container("helper", {"nvidia.com/gpu": 1})


@contextmanager
def changed(kubectl: Kubectl, kind: str, operations: list[dict[str, Any]]) -> Iterator[None]:
    """The shipped configuration `kind` with a JSON patch applied, put back as it was afterwards."""
    webhooks = kubectl.json("get", kind, "gpu-timekeeper")["webhooks"]
    kubectl.run("patch", kind, "gpu-timekeeper", "--type=json", "-p", json.dumps(operations))
    try:
        yield
    finally:
        restore = [{"op": "replace", "path": "/webhooks", "value": webhooks}]
        kubectl.run("patch", kind, "gpu-timekeeper", "--type=json", "-p", json.dumps(restore))


@pytest.fixture
def shipped_again(kubectl: Kubectl, namespace: str) -> Iterator[None]:
    """After the test, wait until the API server admits through the shipped configurations again."""
    yield
    wait_until(
        lambda: admits(kubectl, gpu_probe(namespace)), timeout=30, what="the shipped configurations to serve"
    )


def unreachable() -> str:
    """A loopback URL nothing listens on: the webhook is down."""
    return f"https://127.0.0.1:{free_port()}"


def pointed_at(url: str, path: str) -> list[dict[str, Any]]:
    return [{"op": "replace", "path": "/webhooks/0/clientConfig/url", "value": f"{url}{path}"}]


def test_with_failure_policy_fail_a_gpu_pod_is_refused_while_the_webhook_is_down(
    kubectl: Kubectl, namespace: str, shipped_again: None
) -> None:
    """deployment/ ships `failurePolicy: Fail`: a GPU pod that could not be accounted for is refused."""
    with changed(kubectl, KINDS[0], pointed_at(unreachable(), "/mutate")):
        wait_until(
            lambda: not admits(kubectl, gpu_probe(namespace)),
            timeout=30,
            what="the API server to miss the webhook",
        )
        refusal = kubectl.refusal(
            pod(container("train", {"nvidia.com/gpu": 1}), name="t", namespace=namespace)
        )

    assert 'failed calling webhook "mutate.gpu-timekeeper.io"' in refusal
    assert kubectl.json("get", "pods", "-n", namespace)["items"] == []


def session_error(kubectl: Kubectl, namespace: str, pod_name: str) -> str:
    """What `kubectl exec` into the pod's sidecar prints (it never opens: ours refuses, or no kubelet)."""
    try:
        kubectl.run("exec", pod_name, "-n", namespace, "-c", names.SIDECAR_CONTAINER_NAME, "--", "true")
    except KubectlError as error:
        return error.stderr
    raise AssertionError("a session into our sidecar opened")


def test_with_failure_policy_fail_a_session_into_our_sidecar_is_refused_while_the_webhook_is_down(
    kubectl: Kubectl, namespace: str, shipped_again: None
) -> None:
    """The sessions webhook (`kubectl exec`/`attach` into our sidecar, issue 37) ships `failurePolicy: Fail`
    too: a session that could not be judged does not open. (1.20 has no matchConditions and sends every
    session in the namespaces selected; 1.30+ only those naming our sidecar.)"""
    kubectl.create(pod(container("train", {"nvidia.com/gpu": 1}), name="held", namespace=namespace))
    down = [{"op": "replace", "path": "/webhooks/1/clientConfig/url", "value": f"{unreachable()}/validate"}]
    assert 'admission webhook "sessions.gpu-timekeeper.io" denied' in session_error(
        kubectl, namespace, "held"
    )
    with changed(kubectl, KINDS[1], down):
        wait_until(
            lambda: "failed calling webhook" in session_error(kubectl, namespace, "held"),
            timeout=30,
            what="the API server to miss the sessions webhook",
        )
        refusal = session_error(kubectl, namespace, "held")

    assert 'failed calling webhook "sessions.gpu-timekeeper.io"' in refusal


def dev_overlay_operations() -> list[dict[str, Any]]:
    """The JSON patch deployment/overlays/dev applies to both configurations (failurePolicy: Ignore)."""
    overlay = yaml.safe_load((REPO_ROOT / "deployment/overlays/dev/kustomization.yaml").read_text())
    (patch,) = [p for p in overlay["patches"] if p["target"].get("name") == "gpu-timekeeper"]
    operations: list[dict[str, Any]] = yaml.safe_load(patch["patch"])
    assert {"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"} in operations
    return operations


def test_with_the_dev_overlays_ignore_a_pod_missed_by_mutate_is_denied_by_validate(
    kubectl: Kubectl, namespace: str, shipped_again: None
) -> None:
    """docs/webhook.md: with `Ignore`, a GPU pod admitted while /mutate was down but /validate was up is
    denied by `sidecar-required`; one admitted while both were down runs unaccounted."""
    ignore = dev_overlay_operations()
    train = container("train", {"nvidia.com/gpu": 1})
    with (
        changed(kubectl, KINDS[0], ignore + pointed_at(unreachable(), "/mutate")),
        changed(kubectl, KINDS[1], ignore),
    ):
        wait_until(
            lambda: not admits(kubectl, gpu_probe(namespace)),
            timeout=30,
            what="the API server to miss /mutate",
        )
        refusal = kubectl.refusal(pod(train, name="missed", namespace=namespace))
        with changed(kubectl, KINDS[1], pointed_at(unreachable(), "/validate")):
            wait_until(
                lambda: admits(kubectl, gpu_probe(namespace)),
                timeout=30,
                what="the API server to miss /validate",
            )
            unaccounted = kubectl.create(pod(train, name="unaccounted", namespace=namespace))

    assert 'admission webhook "validate.gpu-timekeeper.io" denied the request' in refusal
    assert "rule sidecar-required" in refusal
    assert names.ANNOTATION_GPU_SHARE not in unaccounted["metadata"].get("annotations", {})
    assert [c["name"] for c in unaccounted["spec"]["containers"]] == ["train"]


class SecondMutator:
    """Another team's mutating webhook, registered after ours: it adds a GPU container to labelled pods."""

    def __init__(self, folder: Path) -> None:
        ca, ca_key = generate_ca("second mutator CA")
        cert, key = generate_serving_cert(ca, ca_key, "second", "test", extra_sans=("127.0.0.1",))
        (folder / "tls.crt").write_bytes(cert)
        (folder / "tls.key").write_bytes(key)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(folder / "tls.crt", folder / "tls.key")
        self.ca = ca
        self.server = LoopbackServer(self._handler(), tls=context).start()

    @staticmethod
    def _handler() -> type[BaseHTTPRequestHandler]:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                containers = review["request"]["object"]["spec"]["containers"]
                patch = []
                if "helper" not in [c["name"] for c in containers]:
                    patch = [{"op": "add", "path": "/spec/containers/-", "value": HELPER}]
                response = {"uid": review["request"]["uid"], "allowed": True}
                if patch:
                    encoded = base64.b64encode(json.dumps(patch).encode()).decode()
                    response |= {"patchType": "JSONPatch", "patch": encoded}
                send_json(self, 200, {**review, "response": response})

        return Handler

    def configuration(self, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "add-helper.test.gpu-timekeeper.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "clientConfig": {
                        "url": f"{self.server.url}/add-helper",
                        "caBundle": base64.b64encode(self.ca).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ],
                    "objectSelector": {"matchLabels": {SECOND_MUTATOR_LABEL: "add-helper"}},
                }
            ],
        }


@pytest.fixture
def second_mutator(kubectl: Kubectl, tmp_path: Path) -> Iterator[SecondMutator]:
    """Registered under a name after ours (the API server calls configurations in name order)."""
    mutator = SecondMutator(tmp_path)
    name = "zz-gtk-test-second-mutator"
    kubectl.create(mutator.configuration(name))
    yield mutator
    kubectl.run("delete", "mutatingwebhookconfiguration", name)
    mutator.server.stop()


def test_a_later_mutator_adding_a_gpu_container_re_invokes_ours(
    kubectl: Kubectl, namespace: str, second_mutator: SecondMutator, shipped_again: None
) -> None:
    """`reinvocationPolicy: IfNeeded`: our webhook runs again after the other one added a GPU, and the
    share (annotation and the sidecar's env) follows the final pod. With `Never` the pod's share would be
    stale, and /validate refuses it."""
    train = pod(
        container("train", {"nvidia.com/gpu": 1}),
        labels={SECOND_MUTATOR_LABEL: "add-helper"},
        namespace=namespace,
    )

    def labelled(name: str) -> dict[str, Any]:
        return train | {"metadata": {**train["metadata"], "name": name}}

    def second_mutator_called() -> bool:
        probe = kubectl.create(labelled("probe"), "--dry-run=server")
        return "helper" in [c["name"] for c in probe["spec"]["containers"]]

    wait_until(second_mutator_called, timeout=30, what="the API server to call the second mutator")
    stored = kubectl.create(labelled("reinvoked"))

    assert [c["name"] for c in stored["spec"]["containers"]] == [
        "train",
        names.SIDECAR_CONTAINER_NAME,
        "helper",
    ]
    assert stored["metadata"]["annotations"][names.ANNOTATION_GPU_SHARE] == "2"
    (sidecar,) = [c for c in stored["spec"]["containers"] if c["name"] == names.SIDECAR_CONTAINER_NAME]
    assert {"name": "SIDECAR_GPU_SHARE", "value": "2"} in sidecar["env"]

    with changed(
        kubectl, KINDS[0], [{"op": "replace", "path": "/webhooks/0/reinvocationPolicy", "value": "Never"}]
    ):
        wait_until(
            lambda: not admits(kubectl, labelled("probe")),
            timeout=30,
            what="the API server to stop re-invoking",
        )
        refusal = kubectl.refusal(labelled("stale"))
    assert 'admission webhook "validate.gpu-timekeeper.io" denied the request' in refusal
