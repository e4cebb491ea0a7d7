"""Inputs a tenant writes that docs/security.md's inventory (issue 37) found deciding a class or a charge,
replayed by the `edit`-only tenant on the real API server: each is refused, governed, or out of its reach.
"""

from __future__ import annotations

import json

import pytest

from tests.cluster.harness import Kubectl, KubectlError, Tenant, TimekeeperApi, wait_for_admission_state
from tests.cluster.test_tenant import OVER_BUDGET, gpu_pod

MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"


def test_a_tenants_pod_marked_as_a_mirror_pod_is_still_governed(
    tenant: Tenant, kubectl: Kubectl, api: TimekeeperApi
) -> None:
    """Both webhooks left a pod carrying `kubernetes.io/config.mirror` alone, whoever created it: an
    exhausted tenant's GPU pod with it and a `nodeName` was stored at `gpu-in-budget`, with no sidecar.
    (A kubelet treats such a pod as an orphaned mirror pod and runs nothing, so the tenant gained a class on
    an object only; nothing of ours should rest on that.) Only a node makes mirror pods: the tenant's is
    judged like any other pod, refused or given the reduced class."""
    api.set_budget(tenant.namespace, 0)
    wait_for_admission_state(kubectl, tenant.namespace, "exhausted")
    # The API server asks a mirror pod for a node: the tenant may name one.
    marked = gpu_pod(tenant.namespace, "not-a-mirror", priorityClassName="gpu-in-budget", nodeName="gpu-node")
    marked["metadata"]["annotations"] = {MIRROR_POD_ANNOTATION: "forged"}

    try:
        stored = tenant.kubectl.create(marked)
    except KubectlError as refused:
        assert "mirror pod" in refused.stderr, refused.stderr
        return
    assert (stored["spec"]["priorityClassName"], stored["spec"]["priority"]) == OVER_BUDGET


def test_a_tenant_cannot_write_the_pod_status_a_charge_is_timed_by(tenant: Tenant) -> None:
    """The reconciler charges a pod from its status (startTime, containers' finishedAt, phase) and the
    webhook reads its DisruptionTarget condition: the kubelet's and the API server's, not `edit`'s."""
    tenant.kubectl.create(gpu_pod(tenant.namespace, "timed"))
    patch = {"status": {"startTime": "2000-01-01T00:00:00Z", "phase": "Succeeded"}}

    with pytest.raises(KubectlError) as refused:
        tenant.kubectl.run(
            "patch", "pod", "timed", "-n", tenant.namespace, "--subresource", "status",
            "--type", "merge", "-p", json.dumps(patch),
        )  # fmt: skip

    assert "forbidden" in refused.value.stderr.lower()
