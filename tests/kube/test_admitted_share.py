"""In Kubernetes auth mode a report is charged at the GPU share its pod was admitted at (the webhook's
annotation, read from the pod on its first report and kept), whatever share the report states: a tenant
whose sidecar claims a millionth of a GPU is charged its whole GPU. Through the app's HTTP layer, against
the stand-in API server and the real database."""

from __future__ import annotations

import logging
from datetime import timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncConnection, async_sessionmaker

from gpuaccounting.names import TOKEN_AUDIENCE
from tests.kube.factories import dra_pod, gpu_node, gpu_pod
from tests.support.kube_apiserver import KubeApiServer
from tests.support.timekeeper import bearer, report_body
from tests.timekeeper.conftest import START
from timekeeper.billing.repository import BillingRepository
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

MISMATCHES = "timekeeper_report_share_mismatches_total"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Without the background scheduler (as tests/kube/test_http.py)."""
    return settings.model_copy(update={"scheduler_enabled": False})


def pod_token(apiserver: KubeApiServer, pod: dict) -> str:
    """The pod's projected token for our audience, as the sidecar presents it."""
    return apiserver.add_service_account_token(
        pod["metadata"]["namespace"], "default", [TOKEN_AUDIENCE], pod=pod
    )


async def send(
    client: httpx.AsyncClient, token: str, pod: dict, seq: int, gpu_share: float, **figures: Any
) -> httpx.Response:
    """The pod's report of the 5 minutes numbered `seq` (one after another), stating `gpu_share` (and
    `figures`: the report's `gpus`, say)."""
    meta = pod["metadata"]
    body = report_body(
        namespace=meta["namespace"],
        pod=meta["name"],
        pod_uid=meta["uid"],
        seq=seq,
        start=START - timedelta(minutes=60 - 5 * seq),
        minutes=5,
        gpu_share=gpu_share,
        **figures,
    )
    return await client.post("/reports", json=body, headers=bearer(token))


async def charged(client: httpx.AsyncClient, token: str, pod: dict, seq: int, gpu_share: float) -> Decimal:
    response = await send(client, token, pod, seq, gpu_share)
    assert response.status_code == 200, response.text
    return Decimal(str(response.json()["gpu_minutes"]))


async def mismatches(client: httpx.AsyncClient) -> float:
    scraped = (await client.get("/metrics")).text
    return next(
        sample.value
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
        if sample.name == MISMATCHES
    )


async def test_a_report_stating_a_smaller_share_is_charged_at_the_admitted_share(
    apiserver: KubeApiServer, client: httpx.AsyncClient
):
    pod = gpu_pod(apiserver, "team-a", "claims-a-millionth", share="1")
    token = pod_token(apiserver, pod)

    # 5 minutes of a whole GPU, not 5 millionths of a GPU-minute.
    assert await charged(client, token, pod, 1, 0.000001) == Decimal(5)
    assert await charged(client, token, pod, 2, 0.000001) == Decimal(5)


async def test_the_pod_is_read_once_and_its_share_kept(apiserver: KubeApiServer, client: httpx.AsyncClient):
    pod = gpu_pod(apiserver, "team-a", "half", share="0.5")
    token = pod_token(apiserver, pod)

    for seq in (1, 2, 3):
        assert await charged(client, token, pod, seq, 0.5) == Decimal("2.5")

    reads = [call for call in apiserver.calls if (call.verb, call.resource) == ("get", "pods")]
    assert [(call.namespace, call.name, call.code) for call in reads] == [("team-a", "half", 200)]


async def test_each_differing_report_is_counted_and_each_pod_logged_once(
    apiserver: KubeApiServer, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING, logger="timekeeper")
    liar, other, honest = (
        gpu_pod(apiserver, "team-a", name, share="1") for name in ("liar", "other", "honest")
    )
    tokens = {
        name: pod_token(apiserver, pod)
        for name, pod in (("liar", liar), ("other", other), ("honest", honest))
    }
    assert await mismatches(client) == 0  # the series is there from the start

    for seq in (1, 2, 3):
        await charged(client, tokens["liar"], liar, seq, 0.000001)
        await charged(client, tokens["honest"], honest, seq, 1)
    await charged(client, tokens["other"], other, 1, 2)  # more than admitted: charged at 1 too

    assert await mismatches(client) == 4
    logged = [
        (record.pod, record.reported_share, record.admitted_share)  # type: ignore[attr-defined]
        for record in caplog.records
        if record.getMessage() == "report_share_differs"
    ]
    assert sorted(logged) == [("liar", "0.000001", "1"), ("other", "2", "1")]


async def test_a_pod_without_a_gpu_is_charged_nothing_whatever_it_states(
    apiserver: KubeApiServer, client: httpx.AsyncClient
):
    pod = apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "cpu-only", "namespace": "team-a"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Running", "startTime": "2026-03-18T11:00:00Z"},
        }
    )
    token = pod_token(apiserver, pod)

    assert await charged(client, token, pod, 1, 4) == 0


async def test_a_dra_pods_sidecar_is_charged_only_its_gpus_outside_claims(
    apiserver: KubeApiServer, client: httpx.AsyncClient
):
    # The webhook recorded the claim's GPU in the share; the claim's charge has that GPU's time.
    only_claims = dra_pod(apiserver, "team-a", "dra", "gpu-claim", started_at="2026-03-18T11:00:00Z")
    both = dra_pod(apiserver, "team-a", "both", "gpu-claim-2", started_at="2026-03-18T11:00:00Z", share="2")
    both["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    both = apiserver.put(both)

    assert await charged(client, pod_token(apiserver, only_claims), only_claims, 1, 1) == 0
    assert await charged(client, pod_token(apiserver, both), both, 1, 2) == Decimal(5)  # its limit's GPU


async def test_an_api_server_that_cannot_be_read_is_a_503_and_charges_nothing(
    apiserver: KubeApiServer, client: httpx.AsyncClient, connection: AsyncConnection
):
    pod = gpu_pod(apiserver, "team-a", "first-report", share="1")
    token = pod_token(apiserver, pod)
    assert (await client.get("/whoami", headers=bearer(token))).status_code == 200  # the token reviewed
    apiserver.stop()

    response = await send(client, token, pod, 1, 0.000001)

    assert response.status_code == 503  # the sidecar keeps the report and retries it
    assert "retry" in response.json()["detail"]
    ledger = await connection.execute(
        sa.text("SELECT count(*) FROM usage_ledger WHERE pod_uid = :uid"), {"uid": pod["metadata"]["uid"]}
    )
    assert ledger.scalar_one() == 0


async def test_a_pod_gone_before_its_first_report_is_refused(
    apiserver: KubeApiServer, client: httpx.AsyncClient
):
    pod = gpu_pod(apiserver, "team-a", "short-lived", share="1")
    token = pod_token(apiserver, pod)
    assert (await client.get("/whoami", headers=bearer(token))).status_code == 200  # the token reviewed
    apiserver.finish_pod_deletion("team-a", "short-lived")

    response = await send(client, token, pod, 1, 0.000001)

    assert response.status_code == 409
    assert "gone" in response.json()["detail"]


async def test_a_first_report_naming_a_cheap_gpu_is_weighted_by_its_nodes_label(
    apiserver: KubeApiServer, client: httpx.AsyncClient, connection: AsyncConnection
):
    """Issue 37: a forged "Tesla T4" first report fixed an H100 pod's model. The first report's read of the
    pod reads its node's `nvidia.com/gpu.product` too; a pod on a node without it counts 1."""
    sessions = async_sessionmaker(bind=connection, join_transaction_mode="create_savepoint")
    async with sessions() as session, session.begin():
        billing = BillingRepository(session)
        await billing.set_weight("NVIDIA-H100-80GB-HBM3", Decimal(3), START - timedelta(days=1), "admin")
        await billing.set_weight("Tesla-T4", Decimal("0.5"), START - timedelta(days=1), "admin")
    gpu_node(apiserver, "h100-node", "NVIDIA-H100-80GB-HBM3")
    gpu_node(apiserver, "plain-node", None)
    forger = gpu_pod(apiserver, "team-a", "forger", node="h100-node")
    unlabelled = gpu_pod(apiserver, "team-a", "unlabelled", node="plain-node")
    t4 = [
        {"uuid": "GPU-0", "sm_util_pct": 90.0, "mem_used_bytes": 1, "mem_total_bytes": 2, "name": "Tesla T4"}
    ]

    token = pod_token(apiserver, forger)
    first, second = [await send(client, token, forger, seq, 1, gpus=t4) for seq in (1, 2)]
    plain = await send(client, pod_token(apiserver, unlabelled), unlabelled, 1, 1, gpus=t4)

    assert [answer.json()["gpu_minutes"] for answer in (first, second, plain)] == [15, 15, 5]
