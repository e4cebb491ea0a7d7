"""The API in Kubernetes auth mode when the API server fails it: the app's lifespan builds the access control
from a kubeconfig, and a review that cannot be made is a 503, not a refusal. What a working API server's
TokenReviews and SubjectAccessReviews decide is proven on a real one (tests/cluster/test_access.py)."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from gpuaccounting.names import TOKEN_AUDIENCE
from tests.kube.factories import gpu_pod
from tests.support.kube_apiserver import KubeApiServer
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


async def test_an_unreachable_api_server_is_a_503_not_a_refusal(
    apiserver: KubeApiServer, client: httpx.AsyncClient
):
    token, pod = _pod_token(apiserver, "team-a", "pod-a")
    apiserver.stop()

    response = await client.post("/reports", json=_report(pod), headers=bearer(token))

    assert response.status_code == 503
    assert "retry" in response.json()["detail"]
