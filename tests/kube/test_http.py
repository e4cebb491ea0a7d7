"""The API in Kubernetes auth mode, end to end: the app's lifespan builds the access control from a
kubeconfig, and every decision is a TokenReview or SubjectAccessReview at the stand-in API server."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from gpuaccounting.names import TOKEN_AUDIENCE
from tests.kube.factories import gpu_pod
from tests.support.kube_apiserver import KubeApiServer
from tests.support.kube_rbac import bind_cluster_role, bind_namespace_viewer
from tests.support.timekeeper import bearer, report_body
from tests.timekeeper.conftest import START
from timekeeper.settings import Settings

# The app's lifespan runs in a session-loop fixture and starts the report batcher there; the requests must
# run on that loop too (as in tests/timekeeper).
pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Without the background scheduler: on the shared loop it would run and commit job claims into the
    suite's shared database (tests/kube/test_reconcile.py claims those windows itself)."""
    return settings.model_copy(update={"scheduler_enabled": False})


def _pod_token(apiserver: KubeApiServer, namespace: str, name: str) -> tuple[str, dict]:
    pod = gpu_pod(apiserver, namespace, name)
    token = apiserver.add_service_account_token(namespace, "default", [TOKEN_AUDIENCE], pod=pod)
    return token, pod


def _report(pod: dict, **overrides) -> dict:
    meta = pod["metadata"]
    return report_body(
        namespace=meta["namespace"],
        pod=meta["name"],
        pod_uid=meta["uid"],
        start=START - timedelta(minutes=10),
        minutes=5,
        **overrides,
    )


async def test_a_pod_reports_for_itself(apiserver: KubeApiServer, client: httpx.AsyncClient):
    token, pod = _pod_token(apiserver, "team-a", "pod-a")

    response = await client.post("/reports", json=_report(pod), headers=bearer(token))

    assert response.status_code == 200, response.text
    assert response.json()["gpu_minutes"] == 5


async def test_pod_a_cannot_report_for_pod_b_or_another_namespace(
    apiserver: KubeApiServer, client: httpx.AsyncClient
):
    token_a, _ = _pod_token(apiserver, "team-a", "pod-a")
    _, pod_b = _pod_token(apiserver, "team-a", "pod-b")
    _, pod_c = _pod_token(apiserver, "team-b", "pod-c")

    for victim in (pod_b, pod_c):
        response = await client.post("/reports", json=_report(victim), headers=bearer(token_a))
        assert response.status_code == 403, response.text

    forged_uid = {**_report(pod_b), "pod": "pod-a"}  # pod A's name, pod B's uid
    assert (await client.post("/reports", json=forged_uid, headers=bearer(token_a))).status_code == 403


async def test_a_token_for_another_audience_cannot_report(
    apiserver: KubeApiServer, client: httpx.AsyncClient
):
    pod = gpu_pod(apiserver, "team-a", "pod-a")
    api_token = apiserver.add_service_account_token("team-a", "default", pod=pod)

    response = await client.post("/reports", json=_report(pod), headers=bearer(api_token))

    assert response.status_code == 403, response.text


async def test_unknown_tokens_are_401(client: httpx.AsyncClient):
    response = await client.get("/namespaces/team-a/budget", headers=bearer("not-a-token"))
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"


async def test_a_member_reads_their_own_budget_but_not_another(
    apiserver: KubeApiServer, client: httpx.AsyncClient
):
    bind_namespace_viewer(apiserver, "team-a", "alice")
    alice = bearer(apiserver.add_user("alice"))

    own = await client.get("/namespaces/team-a/budget", headers=alice)
    other = await client.get("/namespaces/team-b/budget", headers=alice)
    usage = await client.get("/namespaces/team-a/usage", headers=alice)

    assert own.status_code == 200 and own.json()["namespace"] == "team-a"
    assert other.status_code == 403
    assert usage.status_code == 200


async def test_an_unauthorised_user_cannot_edit_a_budget(apiserver: KubeApiServer, client: httpx.AsyncClient):
    bind_namespace_viewer(apiserver, "team-a", "alice")
    alice = bearer(apiserver.add_user("alice"))
    body = {"budget_gpu_minutes": 1_000_000, "period": "monthly"}

    assert (await client.put("/namespaces/team-a/budget", json=body, headers=alice)).status_code == 403
    assert (await client.put("/defaults", json=body, headers=alice)).status_code == 403
    assert (await client.get("/audit", headers=alice)).status_code == 403


async def test_a_budget_admin_edits_and_is_audited_by_name(
    apiserver: KubeApiServer, client: httpx.AsyncClient
):
    bind_cluster_role(apiserver, "gpu-timekeeper-admin", "carol")
    carol = bearer(apiserver.add_user("carol"))
    body = {"budget_gpu_minutes": 600, "period": "monthly"}

    response = await client.put("/namespaces/team-a/budget", json=body, headers=carol)
    audit = await client.get("/audit", headers=carol)

    assert response.status_code == 200, response.text
    assert audit.json()[0]["actor"] == "carol"


async def test_an_unreachable_api_server_is_a_503_not_a_refusal(
    apiserver: KubeApiServer, client: httpx.AsyncClient
):
    token, pod = _pod_token(apiserver, "team-a", "pod-a")
    apiserver.stop()

    response = await client.post("/reports", json=_report(pod), headers=bearer(token))

    assert response.status_code == 503
    assert "retry" in response.json()["detail"]
