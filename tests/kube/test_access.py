"""Kubernetes auth mode: who may report, read and administer, decided by TokenReview and RBAC."""

from __future__ import annotations

import pytest

from gpuaccounting.names import TOKEN_AUDIENCE
from tests.kube.factories import gpu_pod
from tests.support.kube_apiserver import KubeApiServer
from tests.support.kube_rbac import bind_cluster_role, bind_namespace_viewer
from timekeeper.auth.base import Action, PodIdentity, Principal
from timekeeper.auth.kubernetes import KubernetesAccessControl
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


async def _user(
    apiserver: KubeApiServer, access: KubernetesAccessControl, name: str, groups: tuple[str, ...] = ()
) -> Principal:
    """A person with a token for the API server, as the timekeeper authenticates them."""
    principal = await access.authenticate(apiserver.add_user(name, groups=groups))
    assert principal is not None and principal.pod is None
    return principal


async def test_a_pod_token_stands_for_that_pod_only(
    apiserver: KubeApiServer, access: KubernetesAccessControl
):
    token_a, pod_a = _pod_token(apiserver, "team-a", "pod-a")
    _, pod_b = _pod_token(apiserver, "team-a", "pod-b")

    principal = await access.authenticate(token_a)

    assert principal is not None
    assert principal.pod == PodIdentity("team-a", "pod-a", pod_a["metadata"]["uid"])
    assert principal.pod != PodIdentity("team-a", "pod-b", pod_b["metadata"]["uid"])
    assert principal.name == "system:serviceaccount:team-a:default"
    assert "system:serviceaccounts:team-a" in principal.groups


async def test_a_pod_may_report_in_its_own_namespace_only(
    apiserver: KubeApiServer, access: KubernetesAccessControl
):
    token, _ = _pod_token(apiserver, "team-a", "pod-a")
    principal = await access.authenticate(token)
    assert principal is not None

    assert await access.authorize(principal, Action.REPORT, "team-a")
    assert not await access.authorize(principal, Action.REPORT, "team-b")


async def test_a_credential_without_a_pod_may_not_report(
    apiserver: KubeApiServer, access: KubernetesAccessControl
):
    user = await _user(apiserver, access, "alice")
    plain_sa = await access.authenticate(
        apiserver.add_service_account_token("team-a", "builder", [TOKEN_AUDIENCE])
    )
    assert plain_sa is not None and plain_sa.pod is None

    assert not await access.authorize(user, Action.REPORT, "team-a")
    assert not await access.authorize(plain_sa, Action.REPORT, "team-a")


async def test_tokens_for_other_audiences_or_unknown_are_refused(
    apiserver: KubeApiServer, access: KubernetesAccessControl
):
    pod = gpu_pod(apiserver, "team-a", "pod-a")
    vault_token = apiserver.add_service_account_token("team-a", "default", ["vault"], pod=pod)

    assert await access.authenticate(vault_token) is None
    assert await access.authenticate("made-up") is None
    assert await access.authenticate("") is None


async def test_a_pods_api_token_is_a_user_that_may_not_report(
    apiserver: KubeApiServer, access: KubernetesAccessControl
):
    pod = gpu_pod(apiserver, "team-a", "pod-a")
    api_token = apiserver.add_service_account_token("team-a", "default", pod=pod)

    principal = await access.authenticate(api_token)

    assert principal is not None and principal.pod is None
    assert not await access.authorize(principal, Action.REPORT, "team-a")


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


async def test_a_namespace_member_reads_their_own_budget_but_not_another(
    apiserver: KubeApiServer, access: KubernetesAccessControl
):
    bind_namespace_viewer(apiserver, "team-a", "alice")
    alice = await _user(apiserver, access, "alice")

    assert await access.authorize(alice, Action.READ, "team-a")
    assert not await access.authorize(alice, Action.READ, "team-b")
    assert not await access.authorize(alice, Action.READ, None)  # every namespace's budgets


async def test_an_unauthorised_user_cannot_administer(
    apiserver: KubeApiServer, access: KubernetesAccessControl
):
    bind_namespace_viewer(apiserver, "team-a", "alice")
    alice = await _user(apiserver, access, "alice")

    assert not await access.authorize(alice, Action.ADMIN, "team-a")
    assert not await access.authorize(alice, Action.ADMIN, None)


async def test_a_budget_admin_administers_everywhere(
    apiserver: KubeApiServer, access: KubernetesAccessControl
):
    bind_cluster_role(apiserver, "gpu-timekeeper-admin", "carol")
    carol = await _user(apiserver, access, "carol")

    assert await access.authorize(carol, Action.ADMIN, "team-a")
    assert await access.authorize(carol, Action.ADMIN, None)
    assert await access.authorize(carol, Action.READ, None)


async def test_admin_can_be_delegated_for_one_namespace(
    apiserver: KubeApiServer, access: KubernetesAccessControl
):
    bind_cluster_role(apiserver, "gpu-timekeeper-admin", "dave", namespace="team-a")
    dave = await _user(apiserver, access, "dave")

    assert await access.authorize(dave, Action.ADMIN, "team-a")
    assert not await access.authorize(dave, Action.ADMIN, "team-b")
    assert not await access.authorize(dave, Action.ADMIN, None)


async def test_groups_count(apiserver: KubeApiServer, access: KubernetesAccessControl):
    apiserver.put(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "platform-admins"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "gpu-timekeeper-admin",
            },
            "subjects": [{"kind": "Group", "name": "platform", "apiGroup": "rbac.authorization.k8s.io"}],
        }
    )
    erin = await _user(apiserver, access, "erin", ("platform",))
    frank = await _user(apiserver, access, "frank")

    assert await access.authorize(erin, Action.ADMIN, None)
    assert not await access.authorize(frank, Action.ADMIN, None)


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
