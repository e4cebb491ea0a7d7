"""The reconciler against the stand-in API server and the real database: silent pods charged once,
ended pods closed out at their real end, state changes announced, exhausted namespaces downgraded,
concurrent limits applied as ResourceQuotas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from tests.kube.factories import gpu_pod, pdb
from tests.support.kube_apiserver import KubeApiServer
from tests.support.timekeeper import report_body
from tests.timekeeper.conftest import START
from timekeeper.app import create_app
from timekeeper.auth.base import Principal
from timekeeper.budgets.schemas import BudgetIn
from timekeeper.budgets.service import BudgetService
from timekeeper.clock import ManualClock
from timekeeper.kube import KubeClient, QuotaChange
from timekeeper.kube.client import QUOTA_NAME
from timekeeper.reconcile.service import EVICT_ANNOTATION, Reconciler
from timekeeper.settings import Settings
from timekeeper.usage.repository import UsageRepository
from timekeeper.usage.schemas import ReportIn

GRACE = timedelta(minutes=5)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def sessionmaker(connection: AsyncConnection) -> async_sessionmaker[AsyncSession]:
    """Sessions inside the test's transaction; each commit releases a savepoint."""
    return async_sessionmaker(
        bind=connection, expire_on_commit=False, join_transaction_mode="create_savepoint"
    )


@pytest.fixture
async def reconciler(
    kube: KubeClient, sessionmaker: async_sessionmaker[AsyncSession], settings: Settings, clock: ManualClock
) -> AsyncIterator[Reconciler]:
    settings = settings.model_copy(update={"silent_grace_seconds": GRACE.total_seconds()})
    yield Reconciler(kube, sessionmaker, settings, clock)


async def sync(reconciler: Reconciler) -> None:
    """What the watch thread does: bring the registry up to date (here from one list)."""
    reconciler.registry.apply(await asyncio.to_thread(reconciler.kube.list_pods))


async def report(sessionmaker, pod: dict, start: datetime, minutes: float, clock: ManualClock) -> Decimal:
    """A sidecar's report, through the same ingest function the API uses."""
    meta = pod["metadata"]
    body = report_body(
        namespace=meta["namespace"],
        pod=meta["name"],
        pod_uid=meta["uid"],
        start=start,
        minutes=minutes,
        seq=7,
    )
    async with sessionmaker() as session, session.begin():
        outcome = await UsageRepository(session).ingest(ReportIn.model_validate(body), clock.now())
    return outcome.gpu_minutes


async def set_budget(sessionmaker, reconciler: Reconciler, namespace: str, **fields) -> None:
    async with sessionmaker() as session, session.begin():
        service = BudgetService(session, reconciler.settings, reconciler.clock)
        await service.put(namespace, BudgetIn(**fields), Principal(name="admin"))


# ---- charging ----------------------------------------------------------------------------------------


async def test_a_silent_running_pod_is_charged_by_allocation_up_to_the_grace(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    pod = gpu_pod(apiserver, "team-a", "silent", share="0.5", started_at=iso(START - timedelta(minutes=65)))
    await sync(reconciler)

    result = await reconciler.run_pass()

    # 65 minutes running, the last 5 left for the sidecar: 60 minutes x 0.5 GPU.
    assert result is not None
    assert result.charged == {pod["metadata"]["uid"]: Decimal("30.000000000")}
    assert (await reconciler.run_pass()).charged == {}  # nothing new: nothing charged twice


async def test_a_late_sidecar_report_is_not_charged_again(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, clock: ManualClock
):
    started = START - timedelta(minutes=65)
    pod = gpu_pod(apiserver, "team-a", "late", share="1", started_at=iso(started))
    await sync(reconciler)
    await reconciler.run_pass()  # charges [started, START - 5 min]

    # The sidecar's buffered reports arrive: what the pass charged is covered, the rest is new.
    assert await report(sessionmaker, pod, started + timedelta(minutes=10), 10, clock) == 0
    assert await report(sessionmaker, pod, START - timedelta(minutes=10), 8, clock) == 3

    clock.advance(timedelta(minutes=10))
    result = await reconciler.run_pass()
    # Up to START + 5 min: 10 more minutes, of which the sidecar covered 3.
    assert result is not None
    assert result.charged == {pod["metadata"]["uid"]: Decimal("7.000000000")}


async def test_a_reporting_pod_is_charged_only_for_its_gaps(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, clock: ManualClock
):
    started = START - timedelta(minutes=30)
    pod = gpu_pod(apiserver, "team-a", "chatty", share="2", started_at=iso(started))
    await report(sessionmaker, pod, started, 10, clock)
    await report(sessionmaker, pod, started + timedelta(minutes=12), 15, clock)  # a 2-minute gap before
    await sync(reconciler)

    result = await reconciler.run_pass()

    assert result is not None
    assert result.charged == {pod["metadata"]["uid"]: Decimal("4.000000000")}  # 2 minutes x 2 GPUs


async def test_an_ended_pod_is_closed_out_at_its_real_end_once(
    apiserver: KubeApiServer, reconciler: Reconciler, clock: ManualClock
):
    started, finished = START - timedelta(hours=3), START - timedelta(hours=2)
    pod = gpu_pod(
        apiserver,
        "team-a",
        "done",
        phase="Succeeded",
        share="1",
        started_at=iso(started),
        finished_at=iso(finished),
    )
    await sync(reconciler)

    result = await reconciler.run_pass()

    uid = pod["metadata"]["uid"]
    assert result is not None
    assert result.charged == {uid: Decimal("60.000000000")}  # to finishedAt, not to now
    assert result.closed == [uid]
    clock.advance(timedelta(hours=1))
    await sync(reconciler)
    assert (await reconciler.run_pass()).charged == {}


async def test_a_pod_deleted_while_running_is_closed_out_when_seen_gone(
    apiserver: KubeApiServer, reconciler: Reconciler, clock: ManualClock
):
    pod = gpu_pod(apiserver, "team-a", "killed", share="1", started_at=iso(START - timedelta(minutes=20)))
    await sync(reconciler)
    apiserver.finish_pod_deletion("team-a", "killed")
    await sync(reconciler)  # the re-list no longer has it

    result = await reconciler.run_pass()

    assert result is not None
    assert result.charged == {pod["metadata"]["uid"]: Decimal("20.000000000")}  # until seen gone, no grace
    assert reconciler.registry.pods() == []


async def test_the_share_is_recomputed_when_the_annotation_is_missing(
    apiserver: KubeApiServer, reconciler: Reconciler
):
    pod = gpu_pod(
        apiserver, "team-a", "unannotated", share=None, gpus=2, started_at=iso(START - timedelta(minutes=15))
    )
    apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "cpu-only", "namespace": "team-a"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Running", "startTime": iso(START - timedelta(hours=1))},
        }
    )
    await sync(reconciler)

    result = await reconciler.run_pass()

    assert result is not None
    assert result.charged == {pod["metadata"]["uid"]: Decimal("20.000000000")}  # 10 minutes x 2 GPUs


# ---- announcements and downgrades --------------------------------------------------------------------


async def _exhaust(apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, namespace: str) -> None:
    """A first pass learns the states; the namespace then spends its 10 GPU-minutes by one silent pod."""
    await set_budget(sessionmaker, reconciler, namespace, budget_gpu_minutes=10)
    await reconciler.run_pass()
    gpu_pod(apiserver, namespace, "spender", share="1", started_at=iso(START - timedelta(minutes=30)))
    await sync(reconciler)


async def test_an_exhausted_namespace_gets_an_event(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a")

    result = await reconciler.run_pass()

    assert result is not None
    assert result.transitions == {"team-a": ("in_budget", "exhausted")}
    events = [
        e for e in apiserver.list("v1", "Event", "team-a") if e["involvedObject"]["kind"] == "Namespace"
    ]
    assert [(e["reason"], e["type"]) for e in events] == [("GPUBudgetExhausted", "Warning")]
    assert "gpu-over-budget" in events[0]["message"]


async def test_exhausted_annotated_namespaces_evict_in_budget_pods_respecting_pdbs(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "team-a", "annotations": {EVICT_ANNOTATION: "true"}},
        }
    )
    gpu_pod(apiserver, "team-a", "web", labels={"app": "web"})
    gpu_pod(apiserver, "team-a", "guarded", labels={"app": "guarded"})
    gpu_pod(apiserver, "team-a", "bare", labels={"app": "bare"}, controlled=False)
    gpu_pod(apiserver, "team-a", "already-reduced", labels={"app": "r"}, priority_class="gpu-over-budget")
    pdb(apiserver, "team-a", "guarded", {"app": "guarded"}, allowed=0)
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a")

    result = await reconciler.run_pass()

    assert result is not None
    assert sorted(result.evicted) == [("team-a", "spender"), ("team-a", "web")]
    assert result.blocked == [("team-a", "guarded")]
    assert apiserver.get("v1", "Pod", "team-a", "web")["metadata"].get("deletionTimestamp")
    assert not apiserver.get("v1", "Pod", "team-a", "bare")["metadata"].get("deletionTimestamp")
    pod_events = [e for e in apiserver.list("v1", "Event", "team-a") if e["involvedObject"]["kind"] == "Pod"]
    assert {e["involvedObject"]["name"] for e in pod_events} == {"spender", "web"}


async def test_without_the_annotation_nothing_is_evicted(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    gpu_pod(apiserver, "team-a", "web")
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a")

    result = await reconciler.run_pass()

    assert result is not None and result.transitions and result.evicted == []


async def test_bare_pods_are_evicted_only_when_configured(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    reconciler.settings = reconciler.settings.model_copy(
        update={"evict_when_exhausted": "always", "evict_bare_pods": True}
    )
    gpu_pod(apiserver, "team-a", "bare", controlled=False)
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a")

    result = await reconciler.run_pass()

    assert result is not None
    assert ("team-a", "bare") in result.evicted


# ---- quotas ------------------------------------------------------------------------------------------


async def test_the_concurrent_limit_becomes_a_resource_quota_kept_in_shape(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    await set_budget(
        sessionmaker, reconciler, "team-a", budget_gpu_minutes=100, concurrent_gpu_limit=Decimal("2.5")
    )

    result = await reconciler.run_pass()

    assert result is not None and result.quotas == {"team-a": QuotaChange.CREATED}
    quota = apiserver.get("v1", "ResourceQuota", "team-a", QUOTA_NAME)
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "2"
    assert quota["spec"]["hard"]["requests.tencent.com/vcuda-core"] == "250"

    quota["spec"]["hard"]["requests.nvidia.com/gpu"] = "8"  # drift
    apiserver.put(quota)
    assert (await reconciler.run_pass()).quotas == {"team-a": QuotaChange.UPDATED}
    assert (
        apiserver.get("v1", "ResourceQuota", "team-a", QUOTA_NAME)["spec"]["hard"]["requests.nvidia.com/gpu"]
        == "2"
    )

    await set_budget(sessionmaker, reconciler, "team-a", budget_gpu_minutes=100)  # no limit any more
    assert (await reconciler.run_pass()).quotas == {"team-a": QuotaChange.DELETED}
    assert apiserver.get("v1", "ResourceQuota", "team-a", QUOTA_NAME) is None


# ---- running in the app ------------------------------------------------------------------------------


async def test_only_one_replica_reconciles_at_a_time(reconciler: Reconciler, database_url):
    from sqlalchemy import text

    from tests.support.postgres import url_string
    from timekeeper.db.session import build_engine
    from timekeeper.reconcile.repository import RECONCILE_LOCK_KEY

    engine = build_engine(url_string(database_url), pool_size=1)
    async with engine.connect() as other_replica, other_replica.begin():
        await other_replica.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": RECONCILE_LOCK_KEY})
        assert await reconciler.run_pass() is None
    await engine.dispose()
    assert await reconciler.run_pass() is not None


async def test_the_watch_thread_keeps_the_registry_current(apiserver: KubeApiServer, reconciler: Reconciler):
    gpu_pod(apiserver, "team-a", "first")
    reconciler.settings = reconciler.settings.model_copy(update={"reconcile_interval_seconds": 3600})
    reconciler.start()
    try:
        assert await asyncio.to_thread(reconciler.registry.synced.wait, 10)
        gpu_pod(apiserver, "team-a", "second")
        for _ in range(200):
            if len(reconciler.registry.pods()) == 2:
                break
            await asyncio.sleep(0.05)
        assert sorted(p.info.name for p in reconciler.registry.pods()) == ["first", "second"]
    finally:
        await reconciler.aclose()
    assert reconciler._thread is not None and not reconciler._thread.is_alive()


async def test_the_app_runs_the_reconciler_when_asked(apiserver: KubeApiServer, settings: Settings):
    gpu_pod(apiserver, "team-a", "p")
    app = create_app(settings.model_copy(update={"reconcile": True, "reconcile_interval_seconds": 3600}))
    async with app.router.lifespan_context(app):
        reconciler: Reconciler = app.state.reconciler
        assert await asyncio.to_thread(reconciler.registry.synced.wait, 10)
        assert [p.info.name for p in reconciler.registry.pods()] == ["p"]
    assert not reconciler._thread.is_alive()


async def test_a_pod_that_never_started_is_forgotten_without_a_charge(
    apiserver: KubeApiServer, reconciler: Reconciler
):
    gpu_pod(apiserver, "team-a", "unschedulable", phase="Pending", started_at=None)
    await sync(reconciler)
    apiserver.remove("v1", "Pod", "team-a", "unschedulable")
    await sync(reconciler)

    result = await reconciler.run_pass()

    assert result is not None and result.charged == {}
    assert reconciler.registry.pods() == []
