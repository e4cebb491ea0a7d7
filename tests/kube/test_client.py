"""The typed Kubernetes boundary, driven through kubernetes_asyncio against the stand-in server: what needs
the API server to fail on cue (410 Expired, errors, PodDisruptionBudget refusals) or to count requests.
Its reviews, pod list and watch, and Events are proven on a real API server (tests/cluster/test_client.py)."""

from __future__ import annotations

import asyncio
import threading
from contextlib import aclosing
from pathlib import Path

import pytest

from gpuaccounting.backoff import Backoff
from tests.kube.factories import gpu_pod, pdb
from tests.support.kube_apiserver import KubeApiServer
from timekeeper.auth.kubernetes import member_kube_config
from timekeeper.kube import (
    EvictionResult,
    KubeApiError,
    KubeClient,
    KubeUnavailableError,
    PodEvent,
    PodSnapshot,
    QuotaChange,
)
from timekeeper.kube.core import QUOTA_NAME
from timekeeper.kube.types import MANAGED_BY, MANAGED_BY_LABEL
from timekeeper.settings import Settings

# The client's connections belong to the loop of the fixture that built it (the session's).
pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_list_pods_reads_every_page(apiserver: KubeApiServer, kube: KubeClient):
    for i in range(5):
        gpu_pod(apiserver, "team-a", f"p{i}")

    snapshot = await kube.list_pods(page_size=2)

    assert sorted(p.name for p in snapshot.pods) == [f"p{i}" for i in range(5)]
    assert apiserver.requests["list", "pods"] == 3
    assert int(snapshot.resource_version) == apiserver.resource_version


async def test_watch_resumes_from_the_last_event_when_the_server_ends_it(
    apiserver: KubeApiServer, kube: KubeClient
):
    async with aclosing(kube.watch_pods(timeout_seconds=30)) as stream:
        await anext(stream)
        gpu_pod(apiserver, "team-a", "a")
        assert (await anext(stream)).pod.name == "a"  # type: ignore[union-attr]

        # The server ends the watch; the client watches again from "a"'s resourceVersion, without a list.
        apiserver.end_watches()
        gpu_pod(apiserver, "team-a", "b")
        event = await anext(stream)
    assert isinstance(event, PodEvent) and (event.type, event.pod.name) == ("ADDED", "b")
    assert apiserver.requests["watch", "pods"] == 2
    assert apiserver.requests["list", "pods"] == 1


async def test_watch_lists_again_when_its_resource_version_has_expired(
    apiserver: KubeApiServer, kube: KubeClient
):
    gpu_pod(apiserver, "team-a", "old")
    async with aclosing(kube.watch_pods(timeout_seconds=30)) as stream:
        first = await anext(stream)
        assert isinstance(first, PodSnapshot)

        # Changes land while the watch is down, and the history they were in is compacted away: resuming
        # from the old resourceVersion answers 410 Expired, so the client must list again to see them.
        gpu_pod(apiserver, "team-a", "new")
        apiserver.finish_pod_deletion("team-a", "old")
        apiserver.compact()

        # (The generator is lazy: its watch request starts only now, from the compacted resourceVersion.)
        relisted = await anext(stream)
    assert isinstance(relisted, PodSnapshot)
    assert [p.name for p in relisted.pods] == ["new"]
    assert apiserver.requests["list", "pods"] == 2
    assert [c.code for c in apiserver.calls if c.verb == "watch"] == [200]  # the 410 came as an ERROR event


async def test_a_bookmark_moves_the_resume_point_so_no_relist_is_needed(
    apiserver: KubeApiServer, kube: KubeClient
):
    async with aclosing(kube.watch_pods(timeout_seconds=1)) as stream:
        await anext(stream)
        # Other objects change (no pod event carries their resourceVersion); the watch's timeout ends it
        # with a bookmark at the newest resourceVersion, and the client resumes from there.
        apiserver.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "x"}})
        following = asyncio.ensure_future(anext(stream))
        while apiserver.requests["watch", "pods"] < 2:  # noqa: ASYNC110 (the stand-in has no event to await)
            await asyncio.sleep(0.05)
        # Everything before the bookmark is compacted away: resuming from the list would be 410 Expired.
        apiserver.compact()
        gpu_pod(apiserver, "team-a", "after")
        event = await following
    assert isinstance(event, PodEvent) and (event.type, event.pod.name) == ("ADDED", "after")
    assert apiserver.requests["list", "pods"] == 1


async def test_watch_backs_off_on_errors_and_recovers(apiserver: KubeApiServer, kube: KubeClient):
    gpu_pod(apiserver, "team-a", "p")
    binding = apiserver.get("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", None, "gpu-timekeeper")
    assert binding is not None
    apiserver.remove("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", None, "gpu-timekeeper")
    delays: list[float] = []

    def restore_access_after_the_first_failure() -> float:
        delays.append(0.0)
        apiserver.put(binding)
        return 0.0

    backoff = Backoff(0.01, 0.02, rng=restore_access_after_the_first_failure)
    async with aclosing(kube.watch_pods(timeout_seconds=5, backoff=backoff)) as stream:
        snapshot = await anext(stream)

    assert isinstance(snapshot, PodSnapshot) and [p.name for p in snapshot.pods] == ["p"]
    assert len(delays) == 1
    assert [c.code for c in apiserver.calls if c.resource == "pods"] == [403, 200]


async def test_cancelling_the_consumer_ends_the_open_watch_at_once(
    apiserver: KubeApiServer, kube: KubeClient
):
    """A watch waiting on a quiet cluster (its server-side timeout minutes away) ends when the task
    consuming it is cancelled, and it never needed a thread of its own."""
    before = set(threading.enumerate())
    listed = asyncio.Event()
    seen: list[PodSnapshot | PodEvent] = []

    async def consume() -> None:
        async with aclosing(kube.watch_pods(timeout_seconds=300)) as stream:
            async for item in stream:
                seen.append(item)
                listed.set()

    task = asyncio.create_task(consume())
    await listed.wait()
    # The stand-in's counter has no event to wait on; polled on the loop, as a waiting thread would count.
    while apiserver.requests["watch", "pods"] == 0:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    ours = [t for t in set(threading.enumerate()) - before if "process_request_thread" not in t.name]
    assert ours == []  # the stand-in's request threads aside, nothing was started

    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

    assert task.cancelled()
    gpu_pod(apiserver, "team-a", "after")  # nobody is listening any more
    assert len(seen) == 1 and isinstance(seen[0], PodSnapshot)


async def test_eviction_honours_pod_disruption_budgets(apiserver: KubeApiServer, kube: KubeClient):
    gpu_pod(apiserver, "team-a", "guarded", labels={"app": "guarded"})
    gpu_pod(apiserver, "team-a", "free", labels={"app": "free"})
    pdb(apiserver, "team-a", "guarded-pdb", {"app": "guarded"}, allowed=0)

    assert await kube.evict_pod("team-a", "guarded") is EvictionResult.BLOCKED_BY_PDB
    assert apiserver.get("v1", "Pod", "team-a", "guarded")["metadata"].get("deletionTimestamp") is None

    assert await kube.evict_pod("team-a", "free") is EvictionResult.EVICTED
    assert apiserver.get("v1", "Pod", "team-a", "free")["metadata"]["deletionTimestamp"]

    assert await kube.evict_pod("team-a", "never-existed") is EvictionResult.GONE


async def test_eviction_allowed_by_a_budget_spends_it(apiserver: KubeApiServer, kube: KubeClient):
    for name in ("r1", "r2"):
        gpu_pod(apiserver, "team-a", name, labels={"app": "serve"})
    pdb(apiserver, "team-a", "serve-pdb", {"app": "serve"}, allowed=1)

    assert await kube.evict_pod("team-a", "r1") is EvictionResult.EVICTED
    assert await kube.evict_pod("team-a", "r2") is EvictionResult.BLOCKED_BY_PDB


async def test_a_dry_run_eviction_asks_without_evicting_or_spending(
    apiserver: KubeApiServer, kube: KubeClient
):
    for name in ("r1", "r2"):
        gpu_pod(apiserver, "team-a", name, labels={"app": "serve"})
    gpu_pod(apiserver, "team-a", "guarded", labels={"app": "guarded"})
    pdb(apiserver, "team-a", "serve-pdb", {"app": "serve"}, allowed=1)
    pdb(apiserver, "team-a", "guarded-pdb", {"app": "guarded"}, allowed=0)

    assert await kube.evict_pod("team-a", "r1", dry_run=True) is EvictionResult.EVICTED
    assert await kube.evict_pod("team-a", "r2", dry_run=True) is EvictionResult.EVICTED
    assert await kube.evict_pod("team-a", "guarded", dry_run=True) is EvictionResult.BLOCKED_BY_PDB
    assert not any(
        apiserver.get("v1", "Pod", "team-a", n)["metadata"].get("deletionTimestamp") for n in ("r1", "r2")
    )
    assert await kube.evict_pod("team-a", "r1") is EvictionResult.EVICTED  # the budget was not spent


@pytest.mark.parametrize(
    ("served", "sent"),
    [(("v1", "v1beta1"), "policy/v1"), (("v1beta1",), "policy/v1beta1")],
    ids=["1.22-and-later", "1.20"],
)
async def test_eviction_speaks_the_policy_version_the_server_serves(
    apiserver: KubeApiServer, kube: KubeClient, served: tuple[str, ...], sent: str
):
    """The stand-in refuses an Eviction of a version it does not serve, as a 1.20 API server refuses
    policy/v1."""
    apiserver.eviction_versions = served
    gpu_pod(apiserver, "team-a", "trainer")

    assert await kube.evict_pod("team-a", "trainer") is EvictionResult.EVICTED
    assert await kube.eviction_api_version() == sent


async def test_quota_is_created_labelled_then_drift_is_corrected(apiserver: KubeApiServer, kube: KubeClient):
    hard = {"requests.nvidia.com/gpu": "4", "requests.tencent.com/vcuda-core": "400"}

    assert await kube.apply_resource_quota("team-a", hard) is QuotaChange.CREATED
    quota = apiserver.get("v1", "ResourceQuota", "team-a", QUOTA_NAME)
    assert quota["spec"]["hard"] == hard
    assert quota["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY
    assert await kube.apply_resource_quota("team-a", hard) is QuotaChange.UNCHANGED

    # Someone raises the quota by hand; the next pass puts it back.
    quota["spec"]["hard"]["requests.nvidia.com/gpu"] = "40"
    apiserver.put(quota)
    assert await kube.apply_resource_quota("team-a", hard) is QuotaChange.UPDATED
    assert apiserver.get("v1", "ResourceQuota", "team-a", QUOTA_NAME)["spec"]["hard"] == hard


async def test_quota_compares_quantities_by_value(apiserver: KubeApiServer, kube: KubeClient):
    await kube.apply_resource_quota("team-a", {"requests.cnvrg.io/metagpu": "0.5"})
    quota = apiserver.get("v1", "ResourceQuota", "team-a", QUOTA_NAME)
    quota["spec"]["hard"]["requests.cnvrg.io/metagpu"] = "500m"  # as the API server canonicalises it
    apiserver.put(quota)

    assert (
        await kube.apply_resource_quota("team-a", {"requests.cnvrg.io/metagpu": "0.5"})
        is QuotaChange.UNCHANGED
    )


async def test_quotas_are_found_and_removed(apiserver: KubeApiServer, kube: KubeClient):
    await kube.apply_resource_quota("team-a", {"requests.nvidia.com/gpu": "1"})
    await kube.apply_resource_quota("team-b", {"requests.nvidia.com/gpu": "2"})
    apiserver.put(
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "theirs", "namespace": "team-c"}}
    )

    assert await kube.managed_quota_namespaces() == {"team-a", "team-b"}
    assert await kube.delete_resource_quota("team-a") is QuotaChange.DELETED
    assert await kube.delete_resource_quota("team-a") is QuotaChange.ABSENT
    assert await kube.managed_quota_namespaces() == {"team-b"}


async def test_a_missing_rbac_rule_surfaces_as_a_kube_error(apiserver: KubeApiServer):
    token = apiserver.add_service_account_token("elsewhere", "nobody")
    client = KubeClient(apiserver.asyncio_configuration(token))
    with pytest.raises(KubeApiError, match="403") as refused:
        await client.post_event("team-a", "BudgetExhausted", "x")
    assert refused.value.status == 403
    await client.close()


async def test_an_unreachable_api_server_is_unavailable_not_refused(
    apiserver: KubeApiServer, kube: KubeClient
):
    apiserver.stop()
    with pytest.raises(KubeUnavailableError):
        await kube.list_pods()


_MEMBER_KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: b
  cluster: {{server: "https://b.example:6443", certificate-authority: /etc/member/b/ca.crt}}
users:
- name: hub
  user: {user}
contexts:
- name: b
  context: {{cluster: b, user: hub}}
current-context: b
"""


@pytest.mark.parametrize(
    "user",
    [
        '{exec: {apiVersion: client.authentication.k8s.io/v1, command: sh, args: [-c, "id > /tmp/owned"]}}',
        "{auth-provider: {name: oidc, config: {}}}",
        "{tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}",
        "{client-certificate: /etc/hub/tls.crt, client-key: /etc/hub/tls.key}",
    ],
)
def test_a_member_kubeconfig_that_runs_or_reads_on_the_hub_is_refused(tmp_path: Path, user: str) -> None:
    """A member's admin writes its kubeconfig: a command or a hub file in it would run or be sent from the
    hub, so the hub refuses it at start-up, naming the field, before the client library reads it."""
    path = tmp_path / "kubeconfig"
    path.write_text(_MEMBER_KUBECONFIG.format(user=user))
    settings = Settings(auth_mode="kubernetes", members={"b": {"kubeconfig": path}})
    field = user.strip("{").split(":")[0]
    with pytest.raises(ValueError, match=f"user 'hub' has '{field}'"):
        member_kube_config(settings, "b")


def test_a_member_kubeconfig_with_its_credentials_inline_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(_MEMBER_KUBECONFIG.format(user="{token: abc}"))
    settings = Settings(auth_mode="kubernetes", members={"b": {"kubeconfig": path}})
    assert member_kube_config(settings, "b").kubeconfig == path
