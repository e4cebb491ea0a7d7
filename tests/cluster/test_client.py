"""The timekeeper's typed Kubernetes boundary (timekeeper/kube, kubernetes_asyncio) against the real API
server, as deployment/'s gpu-timekeeper ServiceAccount: what its reviews, pod list and watch, and Events
read and write is what Kubernetes really answers and accepts.

What needs the API server to fail on cue (410 Expired, errors and backoff), or to count requests, stays
with the stand-in (tests/kube/test_client.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubernetes import client

from gpuaccounting.names import ANNOTATION_GPU_SHARE, TOKEN_AUDIENCE
from tests.cluster.harness import (
    Kubectl,
    gpu_probe,
    placed,
    service_account_kubeconfig,
    service_account_token,
    set_status,
    sidecar_token,
    stamp,
    terminated,
)
from tests.support.control_plane import ControlPlane
from tests.support.pods import GPU_PODS
from timekeeper.kube import KubeClient, ObjectReference, PodEvent, PodSnapshot
from timekeeper.kube.client import KubeConfig
from timekeeper.kube.types import POD_NAME_EXTRA, POD_UID_EXTRA

pytestmark = [
    # The client's connections belong to the loop of the fixture that built it (the session's).
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.usefixtures("webhook"),  # deployment/ applied, and pods admitted as in a cluster
]


@pytest.fixture
async def kube_client(
    control_plane: ControlPlane, core: client.CoreV1Api, tmp_path: Path
) -> AsyncIterator[KubeClient]:
    """The timekeeper's client with the timekeeper's ServiceAccount: exactly the RBAC deployment/ ships."""
    kubeconfig = service_account_kubeconfig(control_plane, core, "gpu-timekeeper", tmp_path)
    kube = await KubeClient.from_config(KubeConfig(in_cluster=False, kubeconfig=kubeconfig))
    yield kube
    await kube.close()


async def test_token_review_names_the_pod_a_projected_token_is_bound_to(
    kube_client: KubeClient, kubectl: Kubectl, core: client.CoreV1Api, namespace: str
) -> None:
    pod = kubectl.create(placed(gpu_probe(namespace), namespace, "trainer-0"))

    review = await kube_client.token_review(sidecar_token(core, pod), (TOKEN_AUDIENCE,))

    assert review.authenticated
    assert review.username == f"system:serviceaccount:{namespace}:default"
    assert review.extra_value(POD_NAME_EXTRA) == "trainer-0"
    assert review.extra_value(POD_UID_EXTRA) == pod["metadata"]["uid"]
    assert f"system:serviceaccounts:{namespace}" in review.groups
    assert review.audiences == (TOKEN_AUDIENCE,)


async def test_token_review_refuses_another_audience_and_a_deleted_pods_token(
    kube_client: KubeClient, kubectl: Kubectl, core: client.CoreV1Api, namespace: str
) -> None:
    pod = kubectl.create(placed(gpu_probe(namespace), namespace, "trainer-0"))
    api_token = service_account_token(core, namespace, "default", pod=pod)
    token = sidecar_token(core, pod)

    other_audience = await kube_client.token_review(api_token, (TOKEN_AUDIENCE,))
    kubectl.run("delete", "pod", "trainer-0", "-n", namespace)
    gone = await kube_client.token_review(token, (TOKEN_AUDIENCE,))

    assert not other_audience.authenticated and "audience" in other_audience.error
    assert not gone.authenticated


async def test_subject_access_review_answers_from_the_real_rbac(
    kube_client: KubeClient, kubectl: Kubectl, namespace: str
) -> None:
    kubectl.run("create", "rolebinding", "alice", "--clusterrole=view", "--user=alice", "-n", namespace)

    async def may(verb: str, where: str | None) -> bool:
        return await kube_client.subject_access_review(
            "alice", (), verb, "gpubudgets", "gpu-timekeeper.io", where
        )

    for _ in range(600):  # `view` aggregates gpu-timekeeper-viewer through the controller manager
        if await may("get", namespace):
            break
        await asyncio.sleep(0.05)
    assert await may("get", namespace)
    assert not await may("get", "kube-system")
    assert not await may("update", namespace)
    assert not await may("list", None)


async def test_list_pods_reads_every_page_with_share_phase_and_real_end(
    kube_client: KubeClient, kubectl: Kubectl, namespace: str
) -> None:
    half, _ = GPU_PODS["kai"]
    for i in range(4):
        kubectl.create(placed(gpu_probe(namespace), namespace, f"p{i}"))
    kubectl.create(placed(half, namespace, "done"))
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
    finished = start + timedelta(minutes=20)
    stored = kubectl.json("get", "pod", "done", "-n", namespace)
    set_status(
        kubectl,
        namespace,
        "done",
        {
            "phase": "Succeeded",
            "startTime": stamp(start),
            "containerStatuses": terminated(stored, finished),
        },
    )

    snapshot = await kube_client.list_pods(page_size=2)

    ours = {pod.name: pod for pod in snapshot.pods if pod.namespace == namespace}
    assert sorted(ours) == ["done", "p0", "p1", "p2", "p3"]
    assert snapshot.resource_version
    done = ours["done"]
    assert done.ended and done.phase == "Succeeded"
    assert done.annotations[ANNOTATION_GPU_SHARE] == "0.5"
    assert (done.started_at, done.finished_at) == (start, finished)


async def test_watch_streams_every_change_after_the_snapshot(
    kube_client: KubeClient, kubectl: Kubectl, namespace: str
) -> None:
    kubectl.create(placed(gpu_probe(namespace), namespace, "first"))
    async with aclosing(kube_client.watch_pods(timeout_seconds=30)) as stream:
        snapshot = await anext(stream)
        assert isinstance(snapshot, PodSnapshot)
        assert [p.name for p in snapshot.pods if p.namespace == namespace] == ["first"]

        await asyncio.to_thread(kubectl.create, placed(gpu_probe(namespace), namespace, "second"))
        await asyncio.to_thread(set_status, kubectl, namespace, "second", {"phase": "Running"})
        await asyncio.to_thread(kubectl.run, "delete", "pod", "first", "-n", namespace)

        seen: list[tuple[str, str, str]] = []
        while ("DELETED", "first") not in [(kind, name) for kind, name, _ in seen]:
            event = await asyncio.wait_for(anext(stream), timeout=30)
            if isinstance(event, PodEvent) and event.pod.namespace == namespace:
                seen.append((event.type, event.pod.name, event.pod.phase))
    # The API server marks the pod for deletion (MODIFIED) before it removes it (DELETED).
    assert seen[:2] == [("ADDED", "second", "Pending"), ("MODIFIED", "second", "Running")]
    assert seen[2:] == [("MODIFIED", "first", "Pending"), ("DELETED", "first", "Pending")]


async def test_events_about_the_namespace_or_a_pod_are_accepted_and_listed_there(
    kube_client: KubeClient, kubectl: Kubectl, namespace: str
) -> None:
    pod = kubectl.create(placed(gpu_probe(namespace), namespace, "p"))
    await kube_client.post_event(
        namespace, "BudgetExhausted", f"{namespace} spent 600 of 600 GPU-minutes", "Warning"
    )
    await kube_client.post_event(
        namespace,
        "Downgraded",
        "evicted to restart at the reduced class",
        involved=ObjectReference("Pod", "p", namespace=namespace, uid=pod["metadata"]["uid"]),
    )

    events = kubectl.json("get", "events", "-n", namespace)["items"]
    about = {(e["involvedObject"]["kind"], e["involvedObject"]["name"]): e for e in events}
    assert about["Namespace", namespace]["reason"] == "BudgetExhausted"
    assert about["Namespace", namespace]["type"] == "Warning"
    assert about["Pod", "p"]["involvedObject"]["uid"] == pod["metadata"]["uid"]
    assert {e["source"]["component"] for e in events} == {"gpu-timekeeper"}


async def test_the_custom_object_watch_follows_gpubudgets_as_the_timekeeper_may(
    kube_client: KubeClient, kubectl: Kubectl, namespace: str
) -> None:
    """What wakes the GPUBudget sync: the watch deployment/'s RBAC grants (`watch gpubudgets`), on the
    served CRD, sees an object created, changed and deleted."""
    seen: dict[str, asyncio.Event] = {kind: asyncio.Event() for kind in ("ADDED", "MODIFIED", "DELETED")}

    async def follow() -> None:
        watch = kube_client.watch_custom_objects("gpu-timekeeper.io", "v1alpha1", "gpubudgets", 30)
        async with aclosing(watch) as changes:
            async for change, where, name in changes:
                if (where, name) == (namespace, "watched"):
                    seen[change].set()

    async def saw(change: str) -> None:
        async with asyncio.timeout(20):
            await seen[change].wait()

    task = asyncio.create_task(follow())
    body = {
        "apiVersion": "gpu-timekeeper.io/v1alpha1",
        "kind": "GPUBudget",
        "metadata": {"name": "watched", "namespace": namespace},
        "spec": {"budgetGPUMinutes": 10},
    }
    try:
        await asyncio.sleep(0.5)  # the watch is open
        kubectl.run("apply", "-f", "-", stdin=json.dumps(body))
        await saw("ADDED")
        kubectl.run("apply", "-f", "-", stdin=json.dumps(body | {"spec": {"budgetGPUMinutes": 20}}))
        await saw("MODIFIED")
        kubectl.run("delete", "gpubudget", "watched", "-n", namespace)
        await saw("DELETED")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
