"""DRA pods at admission on a real API server: resource.k8s.io/v1 served from CRDs written from the upstream
types (1.20 has no such group), claims and templates shaped like NVIDIA's DRA driver quickstart and HAMi's
demo stored through them, and a webhook that finds the group by discovery and watches them as its own
ServiceAccount (the RBAC deployment/ ships). 1.20 drops a pod's spec.resourceClaims, so the pod's
AdmissionReview is POSTed to that webhook directly, as the API server of 1.34 would send it."""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from typing import Any

import jsonpatch
import orjson
import pytest
from kubernetes import client

from gpuaccounting import names
from tests.cluster.conftest import start_webhook
from tests.cluster.dra_crds import CRDS
from tests.cluster.harness import Kubectl, TimekeeperApi, gpu_probe, wait_for_admission_state
from tests.support.control_plane import ControlPlane
from tests.support.dra import DEVICE_CLASSES, QUICKSTART, SINGLE_GPU, claim, claiming_pod, template
from tests.support.pods import review
from tests.support.processes import TimekeeperProcess, WebhookProcess, free_port, wait_until


@pytest.fixture(scope="module")
def resource_api(kubectl: Kubectl) -> Iterator[None]:
    """resource.k8s.io/v1 served, with NVIDIA's and HAMi's DeviceClasses in it."""
    for definition in CRDS:
        kubectl.create(definition)
    names_ = [f"crd/{definition['metadata']['name']}" for definition in CRDS]
    kubectl.run("wait", "--for=condition=established", "--timeout=60s", *names_)
    for device_class in DEVICE_CLASSES:
        kubectl.create(device_class)
    yield
    kubectl.run("delete", *names_, "--wait=false")


@pytest.fixture(scope="module")
def dra_webhook(
    resource_api: None,
    control_plane: ControlPlane,
    core: client.CoreV1Api,
    webhook_tls: Any,
    timekeeper: TimekeeperProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WebhookProcess]:
    folder = tmp_path_factory.mktemp("dra-webhook")
    process = start_webhook(
        control_plane,
        core,
        webhook_tls,
        timekeeper,
        folder,
        free_port(),
        WEBHOOK_DRA_DISCOVERY_INTERVAL_SECONDS="0.5",
    )
    yield process
    process.stop()


def answer(webhook: WebhookProcess, path: str, pod: dict[str, Any]) -> dict[str, Any]:
    response = webhook.client.post(f"{webhook.url}{path}", json=review(pod))
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()["response"]
    return found


def admit(webhook: WebhookProcess, pod: dict[str, Any]) -> dict[str, Any]:
    patch = orjson.loads(base64.b64decode(answer(webhook, "/mutate", pod)["patch"]))
    return jsonpatch.apply_patch(copy.deepcopy(pod), patch)


@pytest.fixture
def exhausted(kubectl: Kubectl, api: TimekeeperApi, namespace: str, dra_webhook: WebhookProcess) -> str:
    api.set_budget(namespace, 0)
    wait_for_admission_state(kubectl, namespace, "exhausted")
    wait_until(
        lambda: (
            admit(dra_webhook, gpu_probe(namespace))["metadata"]["annotations"][names.ANNOTATION_BUDGET_STATE]
            == "exhausted"
        ),
        timeout=20,
        what="the DRA webhook to see the namespace exhausted",
    )
    return namespace


def sidecar_claims(patched: dict[str, Any]) -> list[dict[str, str]]:
    (sidecar,) = [c for c in patched["spec"]["containers"] if c["name"] == names.SIDECAR_CONTAINER_NAME]
    return list(sidecar["resources"].get("claims", []))


@pytest.mark.parametrize("case", ["gpu-test1", "gpu-test4", "gpu-test6", "first-available", "hami-cores"])
def test_a_template_made_just_before_its_pod_gives_the_reduced_class_and_a_sidecar_listing_the_claim(
    kubectl: Kubectl, exhausted: str, dra_webhook: WebhookProcess, case: str
) -> None:
    spec, share = QUICKSTART[case]
    kubectl.create(template(case, exhausted, spec))  # stored through the upstream schema
    patched = admit(dra_webhook, claiming_pod(exhausted, templates={"gpu": case}, containers=2))
    assert patched["spec"]["priorityClassName"] == "gpu-over-budget"
    assert patched["metadata"]["annotations"][names.ANNOTATION_GPU_SHARE] == share
    assert sidecar_claims(patched) == [{"name": "gpu"}]
    assert answer(dra_webhook, "/validate", patched)["allowed"]


def test_a_named_claim_fails_closed_until_it_exists_and_again_once_deleted(
    kubectl: Kubectl, exhausted: str, dra_webhook: WebhookProcess
) -> None:
    pod = claiming_pod(exhausted, claims={"shared": "shared-gpu"})  # gpu-test3: pods sharing one claim
    denied = answer(dra_webhook, "/validate", pod)
    assert not denied["allowed"] and "rule dra-claim" in denied["status"]["message"]

    kubectl.create(claim("shared-gpu", exhausted, SINGLE_GPU))
    patched = admit(dra_webhook, pod)
    assert (patched["spec"]["priorityClassName"], sidecar_claims(patched)) == (
        "gpu-over-budget",
        [{"name": "shared"}],
    )
    assert answer(dra_webhook, "/validate", patched)["allowed"]

    kubectl.run("delete", "resourceclaim", "shared-gpu", "-n", exhausted)
    wait_until(
        lambda: not answer(dra_webhook, "/validate", pod)["allowed"],
        timeout=20,
        what="the webhook's view to drop the deleted claim",
    )
