"""DRA pods at admission on a real API server: resource.k8s.io/v1 served from CRDs written from the upstream
types (1.20 has no such group), claims and templates shaped like NVIDIA's DRA driver quickstart and HAMi's
demo stored through them, and a webhook that finds the group by discovery and watches them as its own
ServiceAccount (the RBAC deployment/ ships). 1.20 drops a pod's spec.resourceClaims, so the pod's
AdmissionReview is POSTed to that webhook directly, as the API server of 1.34 would send it."""

from __future__ import annotations

import base64
import copy
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import jsonpatch
import orjson
import pytest
from kubernetes import client

from gpuaccounting import names
from tests.cluster.conftest import start_webhook
from tests.cluster.dra_crds import CRDS
from tests.cluster.harness import (
    SILENT_GRACE_SECONDS,
    Kubectl,
    TimekeeperApi,
    gpu_probe,
    placed,
    serve_crds,
    set_status,
    stamp,
    wait_for_admission_state,
)
from tests.support.control_plane import ControlPlane
from tests.support.dra import (
    DEVICE_CLASSES,
    NVIDIA_GPU_CLASS,
    NVIDIA_MIG_CLASS,
    QUICKSTART,
    SINGLE_GPU,
    claim,
    claim_spec,
    claiming_pod,
    mig_profile,
    request,
    template,
)
from tests.support.pods import review
from tests.support.processes import TimekeeperProcess, WebhookProcess, free_port, wait_until


@pytest.fixture(scope="module")
def resource_api(kubectl: Kubectl) -> Iterator[None]:
    """resource.k8s.io/v1 served, with NVIDIA's and HAMi's DeviceClasses in it."""
    names_ = serve_crds(kubectl, CRDS)
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


# ---- charging: the timekeeper's pass lists the claims and slices as its ServiceAccount ------------------


def charged(api: TimekeeperApi, namespace: str) -> dict[str, Decimal]:
    usage = api.ok("GET", f"/namespaces/{namespace}/usage?group_by=pod&since=2000-01-01T00:00:00Z")
    return {row["key"]: Decimal(str(row["gpu_minutes"])) for row in usage["rows"]}


def running_pod(kubectl: Kubectl, namespace: str, name: str, minutes_ago: int) -> dict[str, Any]:
    """A one-GPU pod (its own GPU in its limits) running since `minutes_ago`, as a kubelet would write."""
    stored = kubectl.create(placed(gpu_probe(namespace), namespace, name))
    since = stamp(datetime.now(UTC) - timedelta(minutes=minutes_ago))
    set_status(kubectl, namespace, name, {"phase": "Running", "startTime": since})
    return stored | {"status": {"startTime": since}}


def started(pod: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(pod["status"]["startTime"].replace("Z", "+00:00"))


def publish(kubectl: Kubectl, namespace: str, devices: dict[str, dict[str, str]]) -> None:
    """The driver's part: a ResourceSlice of the devices (name: attributes), in a pool named after the
    namespace (slices are cluster-wide; each test has its own pool)."""
    kubectl.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{namespace}-gpus"},
            "spec": {
                "driver": NVIDIA_GPU_CLASS,
                "nodeName": "gpu-node",
                "pool": {"name": namespace, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": name, "attributes": {k: {"string": v} for k, v in attributes.items()}}
                    for name, attributes in devices.items()
                ],
            },
        }
    )


def allocate(kubectl: Kubectl, namespace: str, name: str, device: str, pods: list[dict[str, Any]]) -> None:
    """The scheduler's part: the claim allocated `device` of the node's pool and reserved for the pods."""
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": NVIDIA_GPU_CLASS, "pool": namespace, "device": device}
                ]
            }
        },
        "reservedFor": [
            {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]} for p in pods
        ],
    }
    kubectl.run(
        "patch",
        "resourceclaim",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        orjson.dumps({"status": status}).decode(),
    )


def test_a_claim_shared_by_two_pods_is_charged_once(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str, resource_api: None
) -> None:
    """1.20 drops a pod's spec.resourceClaims, so the claims' consumers here are pods with a GPU of their
    own in their limits (charged to them, as before): the claim's GPU is charged to the claim, once. (It
    drops a pod's status.extendedResourceClaimStatus too: the scheduler's claim for a pod's extended
    resources, left to the pod's share, is shown in tests/kube/test_dra_charging.py.)"""
    publish(kubectl, namespace, {f"gpu-{i}": {"productName": "NVIDIA H100 80GB HBM3"} for i in (0, 1)})
    first, second = running_pod(kubectl, namespace, "first", 10), running_pod(kubectl, namespace, "second", 6)
    kubectl.create(claim("shared", namespace, SINGLE_GPU))
    allocate(kubectl, namespace, "shared", "gpu-0", [first, second])

    wait_until(
        lambda: "claim.shared" in charged(api, namespace), timeout=30, what="the pass to charge the claim"
    )
    time.sleep(2)  # two more passes
    found = charged(api, namespace)
    since_first = Decimal((datetime.now(UTC) - started(first)).total_seconds()) / 60
    grace = Decimal(SILENT_GRACE_SECONDS) / 60

    assert set(found) == {"claim.shared", "first", "second"}
    # From the first pod's start to the grace: once, not the two pods' 16 minutes.
    assert Decimal(10) - grace <= found["claim.shared"] <= since_first - grace
    assert Decimal(10) - grace <= found["first"] <= since_first - grace


def test_a_mig_claim_is_charged_its_profiles_fraction(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str, resource_api: None
) -> None:
    """NVIDIA's DRA driver publishes a MIG device with its profile and its parent GPU's uuid."""
    parent = f"GPU-{namespace}"
    publish(
        kubectl,
        namespace,
        {
            "gpu-0": {"uuid": parent, "productName": "NVIDIA A100-SXM4-80GB"},
            "gpu-0-mig-1g10gb-0": {"uuid": f"MIG-{namespace}", "profile": "1g.10gb", "parentUUID": parent},
        },
    )
    pod = running_pod(kubectl, namespace, "mig", 14)
    kubectl.create(
        claim(
            "mig", namespace, claim_spec(request("gpu", NVIDIA_MIG_CLASS, selectors=mig_profile("1g.10gb")))
        )
    )
    allocate(kubectl, namespace, "mig", "gpu-0-mig-1g10gb-0", [pod])

    wait_until(
        lambda: "claim.mig" in charged(api, namespace), timeout=30, what="the pass to charge the claim"
    )
    since = Decimal((datetime.now(UTC) - started(pod)).total_seconds()) / 60
    grace = Decimal(SILENT_GRACE_SECONDS) / 60

    # One of the A100's seven slices, for the pod's time up to the grace.
    assert (Decimal(14) - grace) / 7 <= charged(api, namespace)["claim.mig"] <= (since - grace) / 7
