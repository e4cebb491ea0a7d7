"""The reconcile pass against a real API server: its pod watch sees pods created through the webhook, the
time their sidecars never reported is charged, a namespace's `concurrent_gpu_limit` becomes a
ResourceQuota the API server enforces, and budget state changes become Events on the namespace.

There is no kubelet: the tests write pods' phases and times through the status subresource, as a kubelet
would. The timekeeper runs the pass every second with a silent grace of SILENT_GRACE_SECONDS.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from tests.cluster.harness import (
    SILENT_GRACE_SECONDS,
    Kubectl,
    TimekeeperApi,
    gpu_probe,
    placed,
    set_status,
    stamp,
    terminated,
)
from tests.support.pods import GPU_PODS, container, pod
from tests.support.processes import wait_until


def charged(api: TimekeeperApi, namespace: str) -> dict[str, Decimal]:
    usage = api.ok("GET", f"/namespaces/{namespace}/usage?group_by=pod&since=2000-01-01T00:00:00Z")
    return {row["key"]: Decimal(str(row["gpu_minutes"])) for row in usage["rows"]}


def test_an_ended_pod_that_never_reported_is_charged_exactly_its_run(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str
) -> None:
    """Started 10 minutes ago, its containers finished 6 minutes later: one GPU for 6 minutes, once."""
    stored = kubectl.create(placed(gpu_probe(namespace), namespace, "silent"))
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    set_status(
        kubectl,
        namespace,
        "silent",
        {
            "phase": "Succeeded",
            "startTime": stamp(start),
            "containerStatuses": terminated(stored, start + timedelta(minutes=6)),
        },
    )

    wait_until(lambda: "silent" in charged(api, namespace), timeout=30, what="the pass to charge the pod")
    time.sleep(2)  # two more passes: they must charge nothing more

    assert charged(api, namespace) == {"silent": Decimal(6)}


def test_a_running_pod_is_charged_its_silent_time_up_to_the_grace(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str
) -> None:
    half, share = GPU_PODS["kai"]
    assert share == "0.5"
    kubectl.create(placed(half, namespace, "quiet"))
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=3)
    set_status(kubectl, namespace, "quiet", {"phase": "Running", "startTime": stamp(start)})

    wait_until(lambda: "quiet" in charged(api, namespace), timeout=30, what="the pass to charge the pod")
    minutes = charged(api, namespace)["quiet"] / Decimal("0.5")
    elapsed = Decimal((datetime.now(UTC) - start).total_seconds()) / 60

    assert (
        Decimal(3) - Decimal(SILENT_GRACE_SECONDS) / 60
        <= minutes
        <= elapsed - Decimal(SILENT_GRACE_SECONDS) / 60
    )


def test_concurrent_gpu_limit_becomes_a_quota_the_api_server_enforces(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str
) -> None:
    api.set_budget(namespace, 1000, concurrent_gpu_limit=1)

    def enforced() -> bool:
        quotas = kubectl.json("get", "resourcequota", "-n", namespace)["items"]
        # The controller manager fills in status.hard; until then the API server refuses every pod.
        return any(
            q["metadata"]["name"] == "gpu-timekeeper" and q.get("status", {}).get("hard") for q in quotas
        )

    wait_until(enforced, timeout=30, what="the gpu-timekeeper ResourceQuota")
    quota = kubectl.json("get", "resourcequota", "gpu-timekeeper", "-n", namespace)
    two = pod(container("train", {"nvidia.com/gpu": 2}), name="two", namespace=namespace)
    one = pod(container("train", {"nvidia.com/gpu": 1}), name="one", namespace=namespace)
    another = pod(container("train", {"nvidia.com/gpu": 1}), name="another", namespace=namespace)

    refused_two = kubectl.refusal(two)
    kubectl.create(one)
    refused_another = kubectl.refusal(another)

    assert quota["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-timekeeper"
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "1"
    assert "exceeded quota: gpu-timekeeper, requested: requests.nvidia.com/gpu=2" in refused_two
    assert "used: requests.nvidia.com/gpu=1, limited: requests.nvidia.com/gpu=1" in refused_another


def test_the_quota_follows_the_limit_drift_is_corrected_and_it_goes_with_the_limit(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str
) -> None:
    def hard() -> str | None:
        quotas = kubectl.json("get", "resourcequota", "-n", namespace)["items"]
        found = [q["spec"]["hard"].get("requests.nvidia.com/gpu") for q in quotas]
        return found[0] if found else None

    api.set_budget(namespace, 1000, concurrent_gpu_limit=2)
    wait_until(lambda: hard() == "2", timeout=30, what="the quota for a limit of 2")
    drift = json.dumps({"spec": {"hard": {"requests.nvidia.com/gpu": "50"}}})
    kubectl.run("patch", "resourcequota", "gpu-timekeeper", "-n", namespace, "--type=merge", "-p", drift)
    wait_until(lambda: hard() == "2", timeout=30, what="the pass to correct the drift")

    api.set_budget(namespace, 1000, concurrent_gpu_limit=None)
    wait_until(lambda: hard() is None, timeout=30, what="the pass to delete the quota")


def test_budget_state_changes_are_events_on_the_namespace(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str
) -> None:
    def reasons() -> list[str]:
        events = kubectl.json("get", "events", "-n", namespace)["items"]
        return [e["reason"] for e in sorted(events, key=lambda e: e["metadata"]["creationTimestamp"])]

    api.set_budget(namespace, 0)
    wait_until(lambda: "GPUBudgetExhausted" in reasons(), timeout=30, what="the exhausted Event")
    api.ok("POST", f"/namespaces/{namespace}/grants", body={"gpu_minutes": 10, "reason": "cluster test"})
    wait_until(lambda: "GPUBudgetRestored" in reasons(), timeout=30, what="the restored Event")

    (exhausted,) = [
        e
        for e in kubectl.json("get", "events", "-n", namespace)["items"]
        if e["reason"] == "GPUBudgetExhausted"
    ]
    assert exhausted["type"] == "Warning"
    involved = exhausted["involvedObject"]
    assert (involved["kind"], involved["name"], involved.get("namespace")) == (
        "Namespace",
        namespace,
        namespace,
    )
    assert "gpu-over-budget" in exhausted["message"]
