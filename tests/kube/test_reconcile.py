"""The reconciler against the stand-in API server and the real database: silent pods charged once,
ended pods closed out at their real end, state changes announced, exhausted namespaces downgraded,
concurrent limits applied as ResourceQuotas, running pods whose sidecar went silent counted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from gpuaccounting.admission_state import DEFAULT_EXEMPT_NAMESPACES
from tests.kube.factories import gpu_node, gpu_pod, pdb
from tests.support.kube_apiserver import KubeApiServer
from tests.support.processes import wait_until
from tests.support.timekeeper import report_body
from tests.timekeeper.conftest import START
from timekeeper.app import create_app, current
from timekeeper.auth.base import Principal
from timekeeper.billing.repository import BillingRepository
from timekeeper.budgets.schemas import BudgetIn
from timekeeper.budgets.service import BudgetService
from timekeeper.clock import ManualClock
from timekeeper.kube import KubeClient, KubeUnavailableError, QuotaChange
from timekeeper.kube.core import QUOTA_NAME
from timekeeper.periodic.jobs import JOBS_BY_NAME, reconcile_job, run_job
from timekeeper.periodic.repository import RUNNING_POD
from timekeeper.periodic.runner import PeriodicRunner
from timekeeper.reconcile.service import Reconciler
from timekeeper.settings import Settings
from timekeeper.usage.models import PodCoverage
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import IngestService

# The client's connections belong to the loop of the fixture that built it (the session's).
pytestmark = pytest.mark.asyncio(loop_scope="session")

GRACE = timedelta(minutes=5)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ended_pod(
    server: KubeApiServer,
    name: str,
    started: datetime,
    finished: datetime,
    phase: str = "Succeeded",
    share="1",
) -> dict:
    """A GPU pod in team-a whose containers have finished (the kubelet's finishedAt)."""
    return gpu_pod(
        server, "team-a", name, phase=phase, share=share, started_at=iso(started), finished_at=iso(finished)
    )


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
    # research-critical is exempt in team-a, an admin's listing; the system classes where they are by default.
    exempt_namespaces = {**DEFAULT_EXEMPT_NAMESPACES, "research-critical": frozenset({"team-a"})}
    update = {"silent_grace_seconds": GRACE.total_seconds(), "exempt_namespaces": exempt_namespaces}
    yield Reconciler(kube, sessionmaker, settings.model_copy(update=update), clock)


async def sync(reconciler: Reconciler) -> None:
    """What the watch does: bring the registry up to date (here from one list)."""
    reconciler.registry.apply(await reconciler.kube.list_pods())


async def report(
    sessionmaker,
    pod: dict,
    start: datetime,
    minutes: float,
    clock: ManualClock,
    seq: int = 7,
    share: float = 1,
    final: bool = False,
) -> Decimal:
    """A sidecar's report, through the same ingest function the API uses."""
    meta = pod["metadata"]
    body = report_body(
        namespace=meta["namespace"],
        pod=meta["name"],
        pod_uid=meta["uid"],
        start=start,
        minutes=minutes,
        seq=seq,
        gpu_share=share,
        final=final,
    )
    async with sessionmaker() as session, session.begin():
        outcome = await IngestService(session, Settings()).charge_one(
            ReportIn.model_validate(body), clock.now()
        )
    return outcome.gpu_minutes


async def set_budget(sessionmaker, reconciler: Reconciler, namespace: str | None, **fields) -> None:
    """Through the budget API's service, as an admin would; `None`: the defaults."""
    async with sessionmaker() as session, session.begin():
        service = BudgetService(session, reconciler.settings, reconciler.clock)
        if namespace is None:
            await service.put_default(BudgetIn(**fields), Principal(name="admin"))
        else:
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


async def test_a_final_report_from_a_pod_still_running_does_not_end_its_charge(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, clock: ManualClock
):
    """`final` is the report's word (whoever holds the pod's token writes it), the pod's end is the
    kubelet's: time after a final report is charged while the pod runs (issue 37's inventory)."""
    started = START - timedelta(minutes=30)
    pod = gpu_pod(apiserver, "team-a", "said-final", share="1", started_at=iso(started))
    await report(sessionmaker, pod, started, 10, clock, final=True)
    await sync(reconciler)

    result = await reconciler.run_pass()

    assert result.charged == {pod["metadata"]["uid"]: Decimal("15.000000000")}  # to the grace, 5 min ago


async def test_an_ended_pod_is_closed_out_at_its_real_end_once(
    apiserver: KubeApiServer, reconciler: Reconciler, clock: ManualClock
):
    started, finished = START - timedelta(hours=3), START - timedelta(hours=2)
    pod = ended_pod(apiserver, "done", started, finished)
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


async def test_a_tiny_admitted_share_is_charged_not_skipped(apiserver: KubeApiServer, reconciler: Reconciler):
    """A share below what a report may state (KAI's gpu-fraction 0.0000001) is still what admission
    admitted: the silent pod is charged it, on every pass, instead of being skipped on every pass."""
    pod = gpu_pod(
        apiserver, "team-a", "sliver", share="0.0000001", started_at=iso(START - timedelta(minutes=65))
    )
    await sync(reconciler)

    result = await reconciler.run_pass()

    assert result.charged == {pod["metadata"]["uid"]: Decimal("0.000006000")}  # 60 minutes x 1e-7


async def test_reports_are_charged_at_the_share_the_watch_recorded(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, clock: ManualClock
):
    """Static auth mode reads no pod: a pod's first reports are charged at the share they state, until the
    pod watch records the share the pod was admitted at; from then on its reports are charged at that."""
    started = START - timedelta(minutes=65)
    pod = gpu_pod(apiserver, "team-a", "claims-less", share="1", started_at=iso(started))
    assert await report(sessionmaker, pod, started, 10, clock, seq=1, share=0.000001) == Decimal("0.00001")
    await sync(reconciler)

    result = await reconciler.run_pass()

    # The silence after that report at the admitted share: 50 minutes x 1 GPU.
    assert result.charged == {pod["metadata"]["uid"]: Decimal("50.000000000")}
    assert await report(sessionmaker, pod, START - timedelta(minutes=5), 5, clock, seq=2, share=0.000001) == 5


async def test_the_pass_records_each_pods_workload_for_usage_by_workload(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    """The webhook's workload annotation, once the pod has a coverage row (the first charge made it); a
    bare pod none (usage counts it as itself)."""
    started = iso(START - timedelta(minutes=30))
    job = gpu_pod(apiserver, "team-a", "train-0", started_at=started, workload="Job/train")
    bare = gpu_pod(apiserver, "team-a", "scratch", started_at=started, controlled=False)
    await sync(reconciler)

    await reconciler.run_pass()  # charges both (their rows), then records on the next pass
    await reconciler.run_pass()

    async with sessionmaker() as session:
        rows = await session.execute(sa.select(PodCoverage.pod_uid, PodCoverage.workload))
        recorded = dict(rows.tuples().all())
    assert recorded == {job["metadata"]["uid"]: "Job/train", bare["metadata"]["uid"]: None}


# ---- announcements and downgrades --------------------------------------------------------------------


async def _exhaust(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, *namespaces: str, **budget
) -> None:
    """The namespaces get a budget of 10 GPU-minutes (and the other `budget` fields); a first pass learns
    the states; each namespace then spends its budget by one silent pod, `spender`."""
    for namespace in namespaces:
        await set_budget(sessionmaker, reconciler, namespace, budget_gpu_minutes=10, **budget)
    await reconciler.run_pass()
    for namespace in namespaces:
        gpu_pod(apiserver, namespace, "spender", share="1", started_at=iso(START - timedelta(minutes=30)))
    await sync(reconciler)


def deleting(apiserver: KubeApiServer, namespace: str, name: str) -> bool:
    return bool(apiserver.get("v1", "Pod", namespace, name)["metadata"].get("deletionTimestamp"))


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


async def test_exhausted_namespaces_whose_budget_says_evict_lose_their_pods_above_the_reduced_class(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    """Evicted: the in-budget class, a user's own class, no class at all, a class the policy exempts but
    not in this namespace. Kept: the reduced class, a class exempt here, a bare pod, a pod its PDB
    protects (retried next pass)."""
    gpu_pod(apiserver, "team-a", "web", labels={"app": "web"})
    gpu_pod(apiserver, "team-a", "users-own", labels={"app": "own"}, priority_class="high")
    gpu_pod(apiserver, "team-a", "classless", labels={"app": "classless"}, priority_class=None)
    gpu_pod(apiserver, "team-a", "exempt", labels={"app": "exempt"}, priority_class="research-critical")
    gpu_pod(
        apiserver, "team-a", "critical", labels={"app": "critical"}, priority_class="system-cluster-critical"
    )
    gpu_pod(apiserver, "team-a", "reduced", labels={"app": "reduced"}, priority_class="gpu-over-budget")
    gpu_pod(apiserver, "team-a", "bare", labels={"app": "bare"}, controlled=False)
    gpu_pod(apiserver, "team-a", "guarded", labels={"app": "guarded"})
    pdb(apiserver, "team-a", "guarded", {"app": "guarded"}, allowed=0)
    policy = {
        "exempt_classes": ["research-critical", "system-cluster-critical"],
        "user_classes": "replace",
        "ceiling": None,
    }
    await _exhaust(
        apiserver, reconciler, sessionmaker, "team-a", running_pod_action="evict", priority_policy=policy
    )

    result = await reconciler.run_pass()

    evicted = ["classless", "critical", "spender", "users-own", "web"]
    assert sorted(result.evicted) == [("team-a", name) for name in evicted]
    assert result.blocked == [("team-a", "guarded")]
    assert all(deleting(apiserver, "team-a", name) for name in evicted)
    assert not any(deleting(apiserver, "team-a", name) for name in ("exempt", "reduced", "bare", "guarded"))
    pod_events = [e for e in apiserver.list("v1", "Event", "team-a") if e["involvedObject"]["kind"] == "Pod"]
    assert sorted((e["involvedObject"]["name"], e["reason"]) for e in pod_events) == [
        (name, "GPUBudgetDowngrade") for name in evicted
    ]


async def test_the_running_pod_action_is_the_namespaces_own_else_the_defaults(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    await set_budget(sessionmaker, reconciler, None, budget_gpu_minutes=None, running_pod_action="evict")
    await set_budget(sessionmaker, reconciler, "team-a", budget_gpu_minutes=10, running_pod_action="none")
    await _exhaust(apiserver, reconciler, sessionmaker, "team-b")  # its own budget, the default's action
    gpu_pod(apiserver, "team-a", "spender", share="1", started_at=iso(START - timedelta(minutes=30)))
    await sync(reconciler)

    result = await reconciler.run_pass()

    assert set(result.transitions) == {"team-a", "team-b"}
    assert result.evicted == [("team-b", "spender")]
    assert not deleting(apiserver, "team-a", "spender")


async def test_nothing_is_evicted_by_default(apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker):
    gpu_pod(apiserver, "team-a", "web")
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a")

    result = await reconciler.run_pass()

    assert result.transitions and result.evicted == []
    assert not any(call.resource == "pods/eviction" for call in apiserver.calls)


async def test_bare_pods_are_evicted_only_when_configured(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    reconciler.settings = reconciler.settings.model_copy(update={"evict_bare_pods": True})
    gpu_pod(apiserver, "team-a", "bare", controlled=False)
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a", running_pod_action="evict")

    result = await reconciler.run_pass()

    assert ("team-a", "bare") in result.evicted


async def test_a_pass_evicts_at_most_its_limit_the_longest_running_first(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    reconciler.settings = reconciler.settings.model_copy(update={"evictions_per_pass": 2})
    for name, hours in (("newest", 1), ("oldest", 3), ("older", 2)):
        gpu_pod(
            apiserver, "team-a", name, labels={"app": name}, started_at=iso(START - timedelta(hours=hours))
        )
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a", running_pod_action="evict")

    first = await reconciler.run_pass()
    await sync(reconciler)
    second = await reconciler.run_pass()

    assert first.evicted == [("team-a", "oldest"), ("team-a", "older")]
    assert first.deferred == [("team-a", "newest"), ("team-a", "spender")]
    assert second.evicted == [("team-a", "newest"), ("team-a", "spender")]
    assert second.deferred == []


async def test_a_workload_is_evicted_whole_in_one_pass_and_counts_once_against_the_limit(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    """A 3-pod job with the limit at 1 workload per pass: all 3 go in the first pass (a pending one too:
    recreated beside the others, it would keep their class), the namespace's other workload waits."""
    reconciler.settings = reconciler.settings.model_copy(update={"evictions_per_pass": 1})
    for rank in range(3):
        gpu_pod(
            apiserver,
            "team-a",
            f"train-{rank}",
            labels={"job": "train"},
            phase="Pending" if rank == 2 else "Running",
            started_at=None if rank == 2 else iso(START - timedelta(hours=3)),
            workload="Job/train",
        )
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a", running_pod_action="evict")

    first = await reconciler.run_pass()
    await sync(reconciler)
    second = await reconciler.run_pass()

    assert sorted(first.evicted) == [("team-a", f"train-{rank}") for rank in range(3)]
    assert first.deferred == [("team-a", "spender")]
    assert second.evicted == [("team-a", "spender")]


async def test_a_workload_one_of_whose_pods_a_pdb_protects_keeps_all_its_pods(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    for rank in range(3):
        labels = {"job": "train", "guarded": "yes" if rank == 1 else "no"}
        gpu_pod(apiserver, "team-a", f"train-{rank}", labels=labels, workload="Job/train")
    pdb(apiserver, "team-a", "guarded", {"guarded": "yes"}, allowed=0)
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a", running_pod_action="evict")

    result = await reconciler.run_pass()

    assert result.evicted == [("team-a", "spender")]
    assert result.blocked == [("team-a", "train-1")]
    assert not any(deleting(apiserver, "team-a", f"train-{rank}") for rank in range(3))


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


# ---- the scheduler's close-out and the pass's close-out agree -----------------------------------------


async def coverage(sessionmaker, uid: str) -> tuple[bool, datetime | None, datetime, bool]:
    """(final, closed_at, last_report_at, running as the close-out job counts it) of the pod."""
    async with sessionmaker() as session:
        row = (
            await session.execute(
                sa.select(
                    PodCoverage.final,
                    PodCoverage.closed_at,
                    PodCoverage.last_report_at,
                    RUNNING_POD.label("running"),
                ).where(PodCoverage.pod_uid == uid)
            )
        ).one()
    return row.final, row.closed_at, row.last_report_at, row.running


async def charged_to(sessionmaker, uid: str) -> Decimal:
    async with sessionmaker() as session:
        result = await session.execute(
            sa.text("SELECT sum(gpu_minutes) FROM usage_ledger WHERE pod_uid = :uid"), {"uid": uid}
        )
        return result.scalar_one()


async def test_a_pod_that_goes_silent_then_ends_is_closed_and_charged_once_under_both(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, clock: ManualClock
):
    settings = reconciler.settings
    closeout, reconcile = JOBS_BY_NAME["closeout"], reconcile_job(reconciler)
    started = clock.now()
    pod = gpu_pod(apiserver, "team-a", "fading", share="0.5", started_at=iso(started))
    uid = pod["metadata"]["uid"]
    clock.set(started + timedelta(minutes=10))
    assert await report(sessionmaker, pod, started, 10, clock, seq=1, share=0.5) == 5
    await sync(reconciler)

    # Silent for 10 minutes: the close-out job stops counting it as running ...
    clock.set(started + timedelta(minutes=20))
    closed = await run_job(closeout, sessionmaker, settings, clock, "replica")
    assert closed.detail is not None and [p["pod_uid"] for p in closed.detail["closed"]] == [uid]
    # ... and the pass charges its silent time up to the grace, without making it look alive again.
    passed = await run_job(reconcile, sessionmaker, settings, clock, "replica")
    assert passed.detail is not None and passed.detail["charged"] == {uid: "2.500000000"}
    assert await coverage(sessionmaker, uid) == (
        False,
        started + timedelta(minutes=20),
        started + timedelta(minutes=10),
        False,
    )
    clock.advance(timedelta(minutes=1))
    again = await run_job(closeout, sessionmaker, settings, clock, "replica")
    assert again.detail is not None and again.detail["closed"] == []  # nothing re-opened, nothing to close

    # It ends at minute 30: the pass charges the rest up to the real end and closes it there.
    ended_pod(apiserver, "fading", started, started + timedelta(minutes=30), share="0.5")
    clock.set(started + timedelta(minutes=40))
    await sync(reconciler)
    passed = await run_job(reconcile, sessionmaker, settings, clock, "replica")
    assert passed.detail is not None
    assert passed.detail["charged"] == {uid: "7.500000000"} and passed.detail["closed"] == [uid]
    ended = (True, started + timedelta(minutes=30), started + timedelta(minutes=10), False)
    assert await coverage(sessionmaker, uid) == ended
    clock.advance(timedelta(minutes=1))
    again = await run_job(closeout, sessionmaker, settings, clock, "replica")
    assert again.detail is not None and again.detail["closed"] == []
    assert await coverage(sessionmaker, uid) == ended

    # The sidecar's buffered reports of the silence arrive late: covered, charged nothing.
    late = started + timedelta(minutes=10)
    assert await report(sessionmaker, pod, late, 10, clock, seq=2, share=0.5) == 0
    assert await charged_to(sessionmaker, uid) == Decimal("15")  # 30 minutes x 0.5 GPU, once


async def test_a_pod_that_ends_before_the_close_out_notices_is_closed_at_its_real_end(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, clock: ManualClock
):
    settings = reconciler.settings
    started = clock.now() - timedelta(minutes=10)
    finished = clock.now() - timedelta(seconds=30)  # its sidecar's final report was lost
    pod = ended_pod(apiserver, "quick", started, finished, phase="Failed")
    uid = pod["metadata"]["uid"]
    assert await report(sessionmaker, pod, started, 9, clock, seq=1) == 9
    await sync(reconciler)

    passed = await run_job(reconcile_job(reconciler), sessionmaker, settings, clock, "replica")
    closed = await run_job(JOBS_BY_NAME["closeout"], sessionmaker, settings, clock, "replica")

    assert passed.detail is not None and passed.detail["charged"] == {uid: "0.500000000"}
    assert closed.detail is not None and closed.detail["closed"] == []
    assert await coverage(sessionmaker, uid) == (True, finished, clock.now(), False)
    assert await charged_to(sessionmaker, uid) == Decimal("9.5")


async def test_an_ended_pod_with_nothing_left_to_charge_is_still_closed_at_its_end(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, clock: ManualClock
):
    started, finished = clock.now() - timedelta(minutes=10), clock.now() - timedelta(minutes=5)
    pod = ended_pod(apiserver, "covered", started, finished)
    uid = pod["metadata"]["uid"]
    assert await report(sessionmaker, pod, started, 5, clock, seq=1) == 5  # all of it, but not final
    await sync(reconciler)

    result = await reconciler.run_pass()

    assert result.charged == {} and result.closed == [uid]
    assert await coverage(sessionmaker, uid) == (True, finished, clock.now(), False)


# ---- sidecars that stopped reporting -------------------------------------------------------------------


def pod_series(reconciler: Reconciler) -> dict[tuple[str, str], float]:
    """The pod counts as a scrape reads them: {(metric, namespace): value}, through the text format."""
    registry = CollectorRegistry()
    registry.register(reconciler.pod_metrics)
    families = text_string_to_metric_families(generate_latest(registry).decode())
    return {(f.name, s.labels["namespace"]): s.value for f in families for s in f.samples}


async def test_a_running_pod_whose_sidecar_stopped_reporting_counts_as_silent(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, clock: ManualClock, caplog
):
    settings = reconciler.settings  # a sidecar is silent after 300 s without a report (the default)
    begin, started = clock.now(), iso(clock.now() - timedelta(minutes=30))
    chatty = gpu_pod(apiserver, "team-a", "chatty", sidecar=True, started_at=started)
    quiet = gpu_pod(apiserver, "team-a", "quiet", sidecar=True, started_at=started)
    finishing = gpu_pod(apiserver, "team-a", "finishing", sidecar=True, started_at=started)
    gpu_pod(apiserver, "team-a", "never", sidecar=True, started_at=started)  # no report ever came
    gpu_pod(apiserver, "team-a", "bare", started_at=started)  # no sidecar: none to hear from
    done = gpu_pod(
        apiserver,
        "team-a",
        "done",
        sidecar=True,
        phase="Succeeded",
        started_at=started,
        finished_at=iso(begin),
    )
    gpu_pod(apiserver, "team-b", "fresh", sidecar=True, started_at=iso(begin + timedelta(minutes=8)))
    for pod in (chatty, quiet, done):
        await report(sessionmaker, pod, begin - timedelta(minutes=1), 1, clock, seq=1)
    # Its sidecar said goodbye (SIGTERM) while the pod still shows Running: finished, not silent.
    await report(sessionmaker, finishing, begin - timedelta(minutes=1), 1, clock, seq=1, final=True)
    clock.advance(timedelta(minutes=10))
    await report(sessionmaker, chatty, begin + timedelta(minutes=9), 1, clock, seq=2)
    await sync(reconciler)

    # The close-out job sees reports only: it closes out `quiet` and the ended `done` alike ...
    closed = await run_job(JOBS_BY_NAME["closeout"], sessionmaker, settings, clock, "replica")
    assert closed.detail is not None
    assert sorted(p["pod"] for p in closed.detail["closed"]) == ["done", "quiet"]
    # ... the pass, which sees the pod still running, counts it silent (and the one never heard from).
    with caplog.at_level(logging.WARNING, logger="timekeeper.reconcile.census"):
        passed = await run_job(reconcile_job(reconciler), sessionmaker, settings, clock, "replica")
    assert passed.detail is not None
    assert passed.detail["silent"] == [["team-a", "never"], ["team-a", "quiet"]]
    assert pod_series(reconciler) == {
        ("timekeeper_running_gpu_pods", "team-a"): 5,  # chatty, quiet, finishing, never, bare
        ("timekeeper_silent_gpu_pods", "team-a"): 2,
        ("timekeeper_running_gpu_pods", "team-b"): 1,  # fresh: started 2 minutes ago, not heard from yet
        ("timekeeper_silent_gpu_pods", "team-b"): 0,
    }
    logged = [(r.message, r.pod) for r in caplog.records if r.message == "sidecar_silent"]
    assert logged == [("sidecar_silent", "never"), ("sidecar_silent", "quiet")]

    # Still silent a minute later: counted again, not logged again.
    clock.advance(timedelta(minutes=1))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="timekeeper.reconcile.census"):
        assert (await reconciler.run_pass()).silent == [("team-a", "never"), ("team-a", "quiet")]
    assert not [r for r in caplog.records if r.message == "sidecar_silent"]

    # `quiet`'s sidecar reports again (its buffered reports flushed): no longer silent.
    await report(sessionmaker, quiet, begin, 10, clock, seq=2)
    assert (await reconciler.run_pass()).silent == [("team-a", "never")]
    assert pod_series(reconciler)[("timekeeper_silent_gpu_pods", "team-a")] == 1

    # Not leading any more: no counts at all (only the leader's are true).
    await reconciler.stop_leading()
    assert pod_series(reconciler) == {}


async def test_the_job_claims_no_window_until_the_watch_has_listed_the_pods(
    reconciler: Reconciler, sessionmaker, clock: ManualClock
):
    reconciler.settings = reconciler.settings.model_copy(update={"reconcile_interval_seconds": 0.1})
    job = reconcile_job(reconciler)  # no watch has listed anything yet

    with pytest.raises(KubeUnavailableError, match="has not listed the pods"):
        await run_job(job, sessionmaker, reconciler.settings, clock, "replica")

    async with sessionmaker() as session:
        claimed = await session.execute(sa.text("SELECT count(*) FROM job_runs WHERE job = 'reconcile'"))
        assert claimed.scalar_one() == 0
    await sync(reconciler)
    assert (await run_job(job, sessionmaker, reconciler.settings, clock, "replica")).detail is not None


# ---- running in the app ------------------------------------------------------------------------------


async def test_the_watch_runs_while_leading_and_stops_with_leadership(
    apiserver: KubeApiServer, reconciler: Reconciler
):
    gpu_pod(apiserver, "team-a", "first")
    await reconciler.start_leading()
    try:
        await reconciler.wait_synced()
        gpu_pod(apiserver, "team-a", "second")
        await asyncio.to_thread(wait_until, lambda: len(reconciler.registry.pods()) == 2, 10, "the new pod")
        assert sorted(p.info.name for p in reconciler.registry.pods()) == ["first", "second"]
    finally:
        # Leadership lost while the watch waits on its open request (its server-side timeout is minutes
        # away): the watch is cancelled there and then.
        await reconciler.stop_leading()
    assert not reconciler.watching
    gpu_pod(apiserver, "team-a", "unseen")
    assert apiserver.requests["watch", "pods"] == 1
    assert sorted(p.info.name for p in reconciler.registry.pods()) == ["first", "second"]

    # Leading again starts over from a fresh list, on the same client.
    gpu_pod(apiserver, "team-a", "third")
    await reconciler.start_leading()
    try:
        await reconciler.wait_synced()
        assert sorted(p.info.name for p in reconciler.registry.pods()) == [
            "first",
            "second",
            "third",
            "unseen",
        ]
    finally:
        await reconciler.aclose()
    assert not reconciler.watching


async def test_the_app_runs_the_reconciler_as_a_scheduler_job_when_asked(
    apiserver: KubeApiServer, settings: Settings
):
    gpu_pod(apiserver, "team-a", "p")
    app = create_app(
        settings.model_copy(
            update={
                "reconcile": True,
                "reconcile_interval_seconds": 3600,
                "leader_retry_interval": timedelta(seconds=0.2),
                # A slow check on a loaded machine would hand leadership back and forth, emptying the
                # registry this test reads.
                "leader_check_timeout": timedelta(seconds=10),
            }
        )
    )
    async with app.router.lifespan_context(app):
        runner = current(app).scheduler
        assert isinstance(runner, PeriodicRunner)
        assert "reconcile" in [job.name for job in runner.jobs]
        [reconciler] = runner.services
        await asyncio.to_thread(wait_until, lambda: reconciler.watching, 10, "the leader's watch")
        await reconciler.wait_synced()
        assert [p.info.name for p in reconciler.registry.pods()] == ["p"]
    assert not reconciler.watching


async def test_a_pass_waiting_for_the_list_is_woken_by_the_next_leaderships_watch(
    apiserver: KubeApiServer, reconciler: Reconciler
):
    """Leadership lost and taken again (a leader check that timed out on a busy machine) while a pass
    waits for the watch's first list: the new watch's list wakes it. When each leadership built a fresh
    registry the pass waited on the old one's event, which nothing set, for the whole reconcile interval
    (an hour in the app test above, which hung to the suite's timeout)."""
    gpu_pod(apiserver, "team-a", "p")
    await reconciler.start_leading()
    waiting = asyncio.create_task(reconciler.wait_synced())
    await asyncio.sleep(0)
    assert not reconciler.registry.synced.is_set()  # the pass waits; the first watch has not listed
    await reconciler.stop_leading()
    await reconciler.start_leading()
    try:
        # Bounded, so the old hang fails this test rather than the suite's timeout.
        await asyncio.wait({waiting}, timeout=15)
        assert waiting.done() and waiting.exception() is None
        assert [p.info.name for p in reconciler.registry.pods()] == ["p"]
    finally:
        waiting.cancel()
        await reconciler.stop_leading()


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


# ---- the hardware sizes are the webhook's (one file, TIMEKEEPER_HARDWARE_FILE) --------------------------


@pytest.fixture
def sliced(reconciler: Reconciler, tmp_path: Path) -> Reconciler:
    """The reconciler of a cluster whose device plugin time-slices each GPU 4 ways, on 40 GiB GPUs."""
    hardware = tmp_path / "hardware.json"
    hardware.write_text('{"time_slicing_replicas": 4, "gpu_memory_mib": 40960}')
    settings = reconciler.settings.model_copy(update={"hardware_file": hardware})
    return Reconciler(reconciler.kube, reconciler.sessionmaker, settings, reconciler.clock)


async def test_quotas_are_sized_with_the_hardware_file(
    apiserver: KubeApiServer, sliced: Reconciler, sessionmaker
):
    await set_budget(
        sessionmaker, sliced, "team-a", budget_gpu_minutes=100, concurrent_gpu_limit=Decimal("2.5")
    )

    assert (await sliced.run_pass()).quotas == {"team-a": QuotaChange.CREATED}

    hard = apiserver.get("v1", "ResourceQuota", "team-a", QUOTA_NAME)["spec"]["hard"]
    assert hard["requests.nvidia.com/gpu"] == "10"  # 2.5 GPUs x 4 replicas
    assert hard["requests.aliyun.com/gpu-mem"] == "100"  # 2.5 x 40 GiB


async def test_a_recomputed_share_uses_the_hardware_file(apiserver: KubeApiServer, sliced: Reconciler):
    pod = gpu_pod(
        apiserver, "team-a", "unannotated", share=None, gpus=2, started_at=iso(START - timedelta(minutes=15))
    )
    await sync(sliced)

    result = await sliced.run_pass()

    assert result is not None
    assert result.charged == {pod["metadata"]["uid"]: Decimal("5.000000000")}  # 10 minutes x 2/4 GPU


# ---- billing weights: the GPU model from the node ---------------------------------------------------


async def test_a_silent_pod_is_charged_at_its_nodes_gpu_weight(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, clock: ManualClock
):
    async with sessionmaker() as session, session.begin():
        weights = BillingRepository(session)
        await weights.set_weight("NVIDIA-H100-80GB-HBM3", Decimal(3), START - timedelta(days=1), "admin")
        await weights.set_weight("Tesla-T4", Decimal("0.5"), START - timedelta(days=1), "admin")
    gpu_node(apiserver, "h100-node", "NVIDIA-H100-80GB-HBM3")
    gpu_node(apiserver, "t4-node", "Tesla-T4")
    started = iso(START - timedelta(minutes=65))
    big = gpu_pod(apiserver, "team-a", "big", node="h100-node", started_at=started)
    small = gpu_pod(apiserver, "team-a", "small", node="t4-node", started_at=started)
    await sync(reconciler)

    result = await reconciler.run_pass()

    assert result.charged == {
        big["metadata"]["uid"]: Decimal("180.000000000"),  # 60 minutes x 1 GPU x 3
        small["metadata"]["uid"]: Decimal("30.000000000"),
    }
    assert (await reconciler.run_pass()).modelled == 2
    # The sidecar's later report names no GPU: the pod's model, learnt from its node, still weighs it.
    assert await report(sessionmaker, big, START - timedelta(minutes=5), 5, clock) == 15


async def test_the_first_model_told_wins_and_an_unlabelled_node_leaves_the_pod_unweighted(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, clock: ManualClock
):
    gpu_node(apiserver, "odd-node", "Tesla-T4")
    gpu_node(apiserver, "plain-node", None)
    told = gpu_pod(apiserver, "team-a", "told", node="odd-node", started_at=iso(START - timedelta(minutes=3)))
    plain = gpu_pod(
        apiserver, "team-a", "plain", node="plain-node", started_at=iso(START - timedelta(minutes=3))
    )
    # The sidecar told first: an NVML device name on its report.
    body = report_body(
        namespace="team-a",
        pod="told",
        pod_uid=told["metadata"]["uid"],
        start=START - timedelta(minutes=2),
        minutes=1,
        gpus=[
            {
                "uuid": "GPU-0",
                "sm_util_pct": 1.0,
                "mem_used_bytes": 1,
                "mem_total_bytes": 2,
                "name": "NVIDIA L4",
            }
        ],
    )
    async with sessionmaker() as session, session.begin():
        await IngestService(session, Settings()).charge_one(ReportIn.model_validate(body), clock.now())
    await report(sessionmaker, plain, START - timedelta(minutes=2), 1, clock)
    await sync(reconciler)

    result = await reconciler.run_pass()

    assert result.modelled == 1
    async with sessionmaker() as session:
        models = dict(
            (await session.execute(sa.select(PodCoverage.pod, PodCoverage.gpu_model))).tuples().all()
        )
    assert models == {"told": "NVIDIA-L4", "plain": None}


async def test_a_fleet_members_namespaces_are_left_to_their_cluster(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    """A hub's store holds its members' namespaces by key (`a/team-a`, docs/fleet.md): this cluster's
    reconciler neither announces their states, nor evicts, nor writes their quotas here; a member key
    sorting before this cluster's namespaces would otherwise fail the pass's quota writes as a whole."""
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a", running_pod_action="evict")
    await set_budget(sessionmaker, reconciler, "a/team-a", budget_gpu_minutes=0, concurrent_gpu_limit=1)
    await set_budget(sessionmaker, reconciler, "b-team", budget_gpu_minutes=100, concurrent_gpu_limit=1)

    result = await reconciler.run_pass()

    assert result is not None
    assert result.transitions == {"team-a": ("in_budget", "exhausted")}
    assert result.quotas == {"b-team": QuotaChange.CREATED}
    assert deleting(apiserver, "team-a", "spender")
