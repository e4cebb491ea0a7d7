"""`GET /namespaces` in Kubernetes auth mode lists exactly what the caller may read, decided by the stand-in
API server's SubjectAccessReviews over real RBAC objects (deployment/'s roles, `view` aggregated): a
cluster-wide viewer every known namespace, a namespace member the known namespaces they may read, someone
with no access an empty list. The same on a real API server: tests/cluster/test_access.py."""

from __future__ import annotations

import httpx
import pytest

from tests.support.kube_apiserver import KubeApiServer
from tests.support.kube_rbac import bind_cluster_wide, bind_namespace_viewer
from tests.support.timekeeper import bearer
from timekeeper.settings import Settings

# The app's lifespan runs in a session-loop fixture; the requests must run on that loop too.
pytestmark = pytest.mark.asyncio(loop_scope="session")

KNOWN = ("team-a", "team-b", "team-c")


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Without the background scheduler (tests/kube/test_http.py says why); at most 2 reviews in flight,
    fewer than the known namespaces, so the bound is in play."""
    return settings.model_copy(update={"scheduler_enabled": False, "read_scope_concurrency": 2})


@pytest.fixture
async def known(apiserver: KubeApiServer, client: httpx.AsyncClient) -> tuple[str, ...]:
    """Three namespaces the timekeeper knows (each given a budget by a cluster-wide budget admin)."""
    bind_cluster_wide(apiserver, "platform", "gpu-timekeeper-admin")
    admin = bearer(apiserver.add_user("platform"))
    for namespace in KNOWN:
        body = {"budget_gpu_minutes": 100, "period": "monthly"}
        response = await client.put(f"/namespaces/{namespace}/budget", json=body, headers=admin)
        assert response.status_code == 200, response.text
    return KNOWN


async def _listed(client: httpx.AsyncClient, token: str) -> list[str]:
    response = await client.get("/namespaces", headers=bearer(token))
    assert response.status_code == 200, response.text
    return [entry["namespace"] for entry in response.json()]


async def test_a_member_of_two_namespaces_lists_exactly_those(
    apiserver: KubeApiServer, client: httpx.AsyncClient, known: tuple[str, ...]
):
    bind_namespace_viewer(apiserver, "team-a", "alice")
    bind_namespace_viewer(apiserver, "team-c", "alice")
    bind_namespace_viewer(apiserver, "elsewhere", "alice")  # a namespace the timekeeper does not know
    token = apiserver.add_user("alice")
    reviews = apiserver.requests["create", "subjectaccessreviews"]

    assert await _listed(client, token) == ["team-a", "team-c"]
    # The cluster-wide question, then one per known namespace; the repeat is answered from the cache.
    assert apiserver.requests["create", "subjectaccessreviews"] == reviews + 1 + len(known)
    assert await _listed(client, token) == ["team-a", "team-c"]
    assert apiserver.requests["create", "subjectaccessreviews"] == reviews + 1 + len(known)


async def test_a_cluster_wide_viewer_lists_every_known_namespace(
    apiserver: KubeApiServer, client: httpx.AsyncClient, known: tuple[str, ...]
):
    bind_cluster_wide(apiserver, "bob", "gpu-timekeeper-viewer")
    token = apiserver.add_user("bob")
    reviews = apiserver.requests["create", "subjectaccessreviews"]

    assert await _listed(client, token) == list(known)
    assert apiserver.requests["create", "subjectaccessreviews"] == reviews + 1  # no per-namespace review


async def test_someone_who_may_read_nothing_gets_an_empty_list(
    apiserver: KubeApiServer, client: httpx.AsyncClient, known: tuple[str, ...]
):
    """Authenticated but allowed nothing: 200 with no namespace, not 403 (docs/kubernetes.md); a single
    budget read still answers 403, and no token at all stays 401."""
    token = apiserver.add_user("carol")

    assert await _listed(client, token) == []
    single = await client.get("/namespaces/team-a/budget", headers=bearer(token))
    anonymous = await client.get("/namespaces")
    assert (single.status_code, anonymous.status_code) == (403, 401)


async def test_a_pod_token_lists_what_its_service_account_may_read(
    apiserver: KubeApiServer, client: httpx.AsyncClient, known: tuple[str, ...]
):
    """Groups count: RBAC bound to a ServiceAccount's group (all of team-b's accounts) is honoured."""
    subject_group = "system:serviceaccounts:team-b"
    apiserver.put(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "accounts-view", "namespace": "team-b"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "Group", "name": subject_group, "apiGroup": "rbac.authorization.k8s.io"}],
        }
    )
    token = apiserver.add_service_account_token("team-b", "trainer")

    assert await _listed(client, token) == ["team-b"]
