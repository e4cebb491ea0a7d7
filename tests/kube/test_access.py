"""Kubernetes auth mode's own logic around the reviews: how long answers are cached, and refusing API tokens
altogether. Who may report, read and administer is decided by a real API server in
tests/cluster/test_access.py and tests/cluster/test_rbac.py."""

from __future__ import annotations

import pytest

from gpuaccounting.names import TOKEN_AUDIENCE
from tests.kube.factories import gpu_pod
from tests.support.kube_apiserver import KubeApiServer
from tests.support.kube_rbac import bind_namespace_viewer
from timekeeper.auth.base import Action, Principal
from timekeeper.auth.kubernetes import KubernetesAccessControl
from timekeeper.auth.scope import readable_namespaces
from timekeeper.errors import TimekeeperError
from timekeeper.kube import KubeClient

# The client's connections belong to the loop of the fixture that built it (the session's).
pytestmark = pytest.mark.asyncio(loop_scope="session")


class FakeClock:
    """Time for the caches, moved by the test instead of slept through."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def access(kube: KubeClient, clock: FakeClock) -> KubernetesAccessControl:
    return KubernetesAccessControl(kube, token_ttl_seconds=30, decision_ttl_seconds=10, timer=clock)


def _pod_token(apiserver: KubeApiServer, namespace: str, name: str) -> tuple[str, dict]:
    pod = gpu_pod(apiserver, namespace, name)
    return apiserver.add_service_account_token(namespace, "default", [TOKEN_AUDIENCE], pod=pod), pod


async def test_api_tokens_can_be_refused_altogether(apiserver: KubeApiServer, kube: KubeClient):
    strict = KubernetesAccessControl(kube, accept_api_tokens=False)
    assert await strict.authenticate(apiserver.add_user("alice")) is None


async def test_reviews_are_cached_by_token_hash_for_a_short_time(
    apiserver: KubeApiServer, access: KubernetesAccessControl, clock: FakeClock
):
    token, _ = _pod_token(apiserver, "team-a", "pod-a")

    first = await access.authenticate(token)
    second = await access.authenticate(token)
    assert first == second
    assert apiserver.requests["create", "tokenreviews"] == 1

    clock.now += 31
    assert await access.authenticate(token) == first
    assert apiserver.requests["create", "tokenreviews"] == 2


async def test_a_rejection_is_cached_more_briefly(
    apiserver: KubeApiServer, access: KubernetesAccessControl, clock: FakeClock
):
    pod = gpu_pod(apiserver, "team-a", "pod-a")
    token = apiserver.add_service_account_token("team-a", "default", [TOKEN_AUDIENCE], pod=pod)
    apiserver.remove("v1", "Pod", "team-a", "pod-a")

    assert await access.authenticate(token) is None
    reviews = apiserver.requests["create", "tokenreviews"]
    assert await access.authenticate(token) is None
    assert apiserver.requests["create", "tokenreviews"] == reviews

    clock.now += 6  # past the 5 s rejection TTL, well inside the 30 s one
    assert await access.authenticate(token) is None
    assert apiserver.requests["create", "tokenreviews"] > reviews


async def test_decisions_are_cached_briefly(
    apiserver: KubeApiServer, access: KubernetesAccessControl, clock: FakeClock
):
    bind_namespace_viewer(apiserver, "team-a", "alice")
    alice = Principal(name="alice")

    assert await access.authorize(alice, Action.READ, "team-a")
    assert await access.authorize(alice, Action.READ, "team-a")
    assert apiserver.requests["create", "subjectaccessreviews"] == 1

    apiserver.remove("rbac.authorization.k8s.io/v1", "RoleBinding", "team-a", "alice-view")
    clock.now += 11
    assert not await access.authorize(alice, Action.READ, "team-a")
    assert apiserver.requests["create", "subjectaccessreviews"] == 2


async def test_narrowing_asks_each_namespace_once_and_an_unreachable_api_server_is_a_503(
    apiserver: KubeApiServer, access: KubernetesAccessControl, clock: FakeClock
):
    """The per-namespace answers go through the decision cache (a repeat asks nothing); when the API server
    fails the reviews, the listing fails as a whole with the 503 a single read gets, never a partial list."""
    bind_namespace_viewer(apiserver, "team-b", "alice")
    alice = Principal(name="alice")
    known = [f"team-{letter}" for letter in "abcdef"]

    assert await readable_namespaces(access, alice, known, concurrency=3) == {"team-b"}
    assert apiserver.requests["create", "subjectaccessreviews"] == len(known)
    assert await readable_namespaces(access, alice, known, concurrency=3) == {"team-b"}
    assert apiserver.requests["create", "subjectaccessreviews"] == len(known)

    # The timekeeper's own right to ask is gone: every review now fails (as a misconfigured install would).
    apiserver.remove("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", None, "gpu-timekeeper")
    clock.now += 11
    with pytest.raises(TimekeeperError) as refused:
        await readable_namespaces(access, alice, known, concurrency=3)
    assert refused.value.status_code == 503


async def test_a_member_clusters_access_control_asks_its_api_server_about_its_own_keys_only(
    apiserver: KubeApiServer, kube: KubeClient
):
    """A member's principal is asked about by namespace key (timekeeper/domain/clusters.py): another
    cluster's key, or a bare (local) name, is refused without a review; its own is asked by bare name."""
    member = KubernetesAccessControl(kube, cluster="a")
    bind_namespace_viewer(apiserver, "team-a", "alice")
    alice = await member.authenticate(apiserver.add_user("alice"), "a")
    assert alice is not None and alice.cluster == "a"
    assert await member.authenticate(apiserver.add_user("bob"), None) is None  # not this cluster's request

    for other in ("team-a", "b/team-a"):
        assert not await member.authorize(alice, Action.READ, other)
    assert apiserver.requests["create", "subjectaccessreviews"] == 0
    assert await member.authorize(alice, Action.READ, "a/team-a")
    assert not await member.authorize(alice, Action.READ, "a/team-b")
    assert not await member.authorize(Principal(name="alice"), Action.READ, "a/team-a")  # a local principal
