"""What decides whether something is a GPU at all (issue 37, points 5 and 8), replayed by a hostile tenant: a
member of its namespace with only the built-in `edit` role (aggregated with resource.k8s.io claims and
templates, as a cluster offering DRA to its tenants grants them), the namespace's budget exhausted, on the
real API server.

- A claim the tenant annotates `resource.kubernetes.io/extended-resource-claim` (itself, or through its
  template's spec.metadata) is charged: only the pod's status, which the scheduler writes, says a claim is
  the one made for the pod's extended resources (docs/timekeeper.md, "DRA claims").
- GPUs under the GPU Operator's sandbox and vGPU names are counted at their share, and a MIG name with media
  extensions as the device plugin advertises it is admitted at its profile's share; what NVIDIA's domain
  holds that the catalogue does not know is refused with the key to add (docs/webhook.md, "GPU catalogue").
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from gpuaccounting import names
from tests.cluster.dra_crds import CRDS
from tests.cluster.harness import (
    SILENT_GRACE_SECONDS,
    Kubectl,
    Tenant,
    TimekeeperApi,
    gpu_probe,
    placed,
    serve_crds,
    set_status,
    stamp,
    wait_for_admission_state,
)
from tests.cluster.test_dra import allocate, charged, publish, started
from tests.support.dra import DEVICE_CLASSES, EXTENDED_RESOURCE_CLAIM, SINGLE_GPU, claim, template
from tests.support.pods import container, pod
from tests.support.processes import wait_until

# What a cluster offering DRA to its tenants aggregates into `edit`: a namespace's members write claims and
# templates, never a claim's status (the scheduler's) nor DeviceClasses (the admin's).
DRA_EDIT_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {
        "name": "tenant-resources-dra-edit",
        "labels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"},
    },
    "rules": [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims", "resourceclaimtemplates"],
            "verbs": ["create", "delete", "deletecollection", "patch", "update", "get", "list", "watch"],
        }
    ],
}


def gone(kubectl: Kubectl, references: list[str]) -> bool:
    return not kubectl.run("get", *references, "--ignore-not-found", "-o", "name").strip()


@pytest.fixture(scope="module")
def tenant_dra(kubectl: Kubectl) -> Iterator[None]:
    """resource.k8s.io/v1 served (once test_dra's copy is gone), NVIDIA's DeviceClasses in it, and `edit`
    granted claims and templates."""
    references = [f"crd/{definition['metadata']['name']}" for definition in CRDS]
    wait_until(lambda: gone(kubectl, references), timeout=60, what="an earlier module's DRA CRDs to go")
    serve_crds(kubectl, CRDS)
    for device_class in DEVICE_CLASSES:
        kubectl.create(device_class)
    kubectl.create(DRA_EDIT_ROLE)

    def aggregated() -> bool:
        edit = kubectl.json("get", "clusterrole", "edit")
        return any("resourceclaims" in rule.get("resources", []) for rule in edit.get("rules") or [])

    wait_until(aggregated, timeout=30, what="`edit` to aggregate the DRA rules")
    yield
    kubectl.run("delete", "clusterrole", DRA_EDIT_ROLE["metadata"]["name"], "--wait=false")
    kubectl.run("delete", *references, "--wait=false")


@pytest.fixture
def exhausted(kubectl: Kubectl, api: TimekeeperApi, tenant: Tenant) -> Tenant:
    api.set_budget(tenant.namespace, 0)
    wait_for_admission_state(kubectl, tenant.namespace, "exhausted")
    return tenant


def tenant_gpu_pod(kubectl: Kubectl, tenant: Tenant, name: str, minutes_ago: int) -> dict[str, Any]:
    """The tenant's one-GPU pod (1.20 drops spec.resourceClaims, so the claim's consumer has a GPU of its
    own), running since `minutes_ago` as a kubelet would write (the admin plays the kubelet)."""
    stored = tenant.kubectl.create(placed(gpu_probe(tenant.namespace), tenant.namespace, name))
    assert stored["spec"]["priorityClassName"] == "gpu-over-budget"
    since = stamp(datetime.now(UTC) - timedelta(minutes=minutes_ago))
    set_status(kubectl, tenant.namespace, name, {"phase": "Running", "startTime": since})
    return stored | {"status": {"startTime": since}}


def annotated_claim(kubectl: Kubectl, tenant: Tenant, route: str) -> str:
    """The tenant's claim for one GPU marked as an extended resource's: written on the claim, or on its
    template's spec.metadata, which the resourceclaim controller copies onto the claim it makes (1.20 runs
    none: the admin plays it). The claim's name."""
    namespace, marker = tenant.namespace, {EXTENDED_RESOURCE_CLAIM: "true"}
    if route == "claim":
        body = claim("free-gpu", namespace, SINGLE_GPU)
        body["metadata"]["annotations"] = marker
        return str(tenant.kubectl.create(body)["metadata"]["name"])
    body = template("free-gpu", namespace, SINGLE_GPU)
    body["spec"]["metadata"] = {"annotations": marker}
    made = tenant.kubectl.create(body)
    from_template = claim("free-gpu-gpu-x7k2p", namespace, made["spec"]["spec"])
    from_template["metadata"]["annotations"] = made["spec"]["metadata"]["annotations"]
    return str(kubectl.create(from_template)["metadata"]["name"])


@pytest.mark.parametrize("route", ["claim", "template"])
def test_a_claim_the_tenant_marks_as_an_extended_resources_is_charged(
    kubectl: Kubectl, api: TimekeeperApi, exhausted: Tenant, tenant_dra: None, route: str
) -> None:
    namespace = exhausted.namespace
    publish(kubectl, namespace, {"gpu-0": {"productName": "NVIDIA H100 80GB HBM3"}})
    user = tenant_gpu_pod(kubectl, exhausted, "user", 10)
    name = annotated_claim(kubectl, exhausted, route)
    allocate(kubectl, namespace, name, "gpu-0", [user])  # the scheduler's part

    wait_until(
        lambda: f"claim.{name}" in charged(api, namespace), timeout=30, what="the pass to charge the claim"
    )
    since = Decimal((datetime.now(UTC) - started(user)).total_seconds()) / 60
    grace = Decimal(SILENT_GRACE_SECONDS) / 60

    # The claim's GPU for the pod's time up to the grace, beside the pod's own GPU.
    assert Decimal(10) - grace <= charged(api, namespace)[f"claim.{name}"] <= since - grace


def shares_admitted(tenant: Tenant, resource: str, count: int = 1) -> tuple[str, str, str]:
    """The tenant's pod asking `count` of `resource`, created: its class, share and sharing system."""
    name = re.sub("[^a-z0-9]+", "-", resource.lower())
    body = pod(container("main", {resource: count}), name=name, namespace=tenant.namespace)
    stored = tenant.kubectl.create(body)
    annotations = stored["metadata"].get("annotations", {})
    return (
        stored["spec"].get("priorityClassName", ""),
        annotations.get(names.ANNOTATION_GPU_SHARE, "not a GPU"),
        annotations.get(names.ANNOTATION_SHARING_SYSTEM, ""),
    )


@pytest.mark.parametrize(
    ("resource", "share", "system"),
    [
        ("nvidia.com/mig-1g.10gb.me", "0.142857", "nvidia-mig"),  # one of an A100's or H100's 7 slices
        ("nvidia.com/GA102GL_A10", "1", "nvidia"),  # the sandbox device plugin's passthrough A10
        ("nvidia.com/NVIDIA_A10-12Q", "0.5", "nvidia-vgpu"),  # 12 GB of the A10's 24
    ],
)
def test_gpus_under_the_gpu_operators_names_are_counted_at_their_share(
    exhausted: Tenant, resource: str, share: str, system: str
) -> None:
    assert shares_admitted(exhausted, resource) == ("gpu-over-budget", share, system)


@pytest.mark.parametrize(
    ("resource", "key"),
    [
        ("nvidia.com/NVIDIA_B9-12Q", 'add "B9" to vgpu_board_memory_gb'),
        ("nvidia.com/2236", 'add "nvidia.com/2236" to gpu_resources'),  # a GPU pci.ids does not name
    ],
)
def test_a_gpu_vendors_name_the_catalogue_does_not_know_is_refused_with_the_key_to_add(
    exhausted: Tenant, resource: str, key: str
) -> None:
    body = pod(container("main", {resource: 1}), name="unknown", namespace=exhausted.namespace)
    refusal = exhausted.kubectl.refusal(body)
    assert key in refusal and "rule unknown-accelerator" in refusal
