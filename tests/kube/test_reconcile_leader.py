"""The reconcile pass as a job of the scheduler: two apps on one database (committed, a database of this
module's own) against the stand-in API server. Only the leader watches pods and reconciles; when
leadership moves, the new leader starts its watch and the silent time is charged exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.kube.factories import gpu_pod
from tests.kube.test_reconcile import iso
from tests.support.kube_apiserver import KubeApiServer
from tests.support.postgres import url_string
from tests.support.processes import wait_until
from tests.support.timekeeper import migrated_database
from tests.timekeeper.conftest import START
from timekeeper.app import create_app, current
from timekeeper.clock import ManualClock
from timekeeper.db.session import build_engine
from timekeeper.periodic.jobs import floor_to
from timekeeper.periodic.runner import PeriodicRunner
from timekeeper.reconcile.service import Reconciler
from timekeeper.settings import Settings

LOCK_KEY = 4243  # not the other tests' scheduler lock
INTERVAL = timedelta(seconds=0.2)


@pytest.fixture(scope="module")
def own_database() -> Iterator[URL]:
    with migrated_database("gtk_reconcile_leader") as url:
        yield url


@pytest.fixture
async def engine(own_database: URL) -> AsyncIterator[AsyncEngine]:
    engine = build_engine(url_string(own_database), pool_size=2)
    yield engine
    await engine.dispose()


@pytest.fixture
def leader_settings(own_database: URL, kubeconfig: Path) -> Settings:
    return Settings(
        database_url=url_string(own_database),
        kube_in_cluster=False,
        kubeconfig=kubeconfig,
        reconcile=True,
        reconcile_interval_seconds=INTERVAL.total_seconds(),
        silent_grace_seconds=300,
        scheduler_lock_key=LOCK_KEY,
        leader_retry_interval=INTERVAL,
        # Fast rounds, but a check slow on a loaded machine must not hand leadership over on its own:
        # these tests move it by killing the lock's session, which fails the check at once.
        leader_check_timeout=timedelta(seconds=10),
    )


def runner_of(app: FastAPI) -> PeriodicRunner:
    runner = current(app).scheduler
    assert isinstance(runner, PeriodicRunner)
    return runner


def reconciler_of(app: FastAPI) -> Reconciler:
    [reconciler] = runner_of(app).services
    assert isinstance(reconciler, Reconciler)
    return reconciler


async def until(condition, what: str) -> None:
    await asyncio.to_thread(wait_until, condition, 15, what)


async def get(app: FastAPI, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tk") as client:
        return await client.get(path)


async def readyz(app: FastAPI) -> dict:
    """What /readyz shows a reader (these apps have no tokens): the runner's status."""
    return runner_of(app).status()


async def pod_charges(engine: AsyncEngine, uid: str) -> tuple[list[Decimal], str]:
    """The pod's ledger charges in order, and its coverage as PostgreSQL prints it."""
    async with engine.connect() as connection:
        charges = await connection.execute(
            sa.text("SELECT gpu_minutes FROM usage_ledger WHERE pod_uid = :uid ORDER BY id"), {"uid": uid}
        )
        covered = await connection.execute(
            sa.text("SELECT CAST(covered AS text) FROM pod_coverage WHERE pod_uid = :uid"), {"uid": uid}
        )
        return list(charges.scalars()), covered.scalar_one()


async def test_only_the_leader_reconciles_and_a_new_leader_charges_the_silent_time_once(
    apiserver: KubeApiServer, leader_settings: Settings, engine: AsyncEngine
) -> None:
    clock = ManualClock(START)
    pod = gpu_pod(apiserver, "team-a", "silent", share="1", started_at=iso(START - timedelta(minutes=60)))
    uid = pod["metadata"]["uid"]
    first, second = create_app(leader_settings, clock), create_app(leader_settings, clock)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(first.router.lifespan_context(first))
        await until(lambda: runner_of(first).health["reconcile"].last_success, "the first app reconciles")
        await stack.enter_async_context(second.router.lifespan_context(second))
        await until(lambda: runner_of(second).election.rounds >= 5, "the second app tried the lock 5 times")

        # One leader: it alone watches pods and runs the pass; its pass charged 55 silent minutes (up to
        # the 5-minute grace).
        assert runner_of(first).leading and not runner_of(second).leading
        assert reconciler_of(first).watching and not reconciler_of(second).watching
        assert runner_of(second).health["reconcile"].last_run is None
        assert (await readyz(first))["jobs"]["reconcile"]["last_success"] is not None
        assert (await readyz(second))["jobs"]["reconcile"]["last_run"] is None
        # The window ran once: later runs of the same window are skipped.
        metrics = (await get(first, "/metrics")).text
        assert 'timekeeper_job_runs_total{job="reconcile",outcome="ok"} 1.0' in metrics
        # Only the leader's pass counts pods (a follower's figures would be stale): one running in team-a.
        assert 'timekeeper_running_gpu_pods{namespace="team-a"} 1.0' in metrics
        assert "timekeeper_running_gpu_pods{" not in (await get(second, "/metrics")).text
        assert await pod_charges(engine, uid) == (
            [Decimal("55")],
            '{["2026-03-18 11:00:00+00","2026-03-18 11:55:00+00")}',
        )

        # The leader's lock session dies: it stops its watch and becomes a follower; the other app
        # takes over and starts its own.
        async with engine.connect() as connection:
            killed = await connection.execute(
                sa.text(
                    "SELECT pg_terminate_backend(l.pid) FROM pg_locks l "
                    "JOIN pg_database d ON d.oid = l.database AND d.datname = current_database() "
                    "WHERE l.locktype = 'advisory' AND l.granted "
                    "AND ((l.classid::bigint << 32) | l.objid::bigint) = :key"
                ),
                {"key": LOCK_KEY},
            )
            assert killed.scalars().all() == [True]
        await until(lambda: runner_of(second).leading and not runner_of(first).leading, "the handover")
        await until(lambda: reconciler_of(second).watching, "the new leader's watch")
        await until(lambda: not reconciler_of(first).watching, "the old leader's watch to stop")

        # Ten minutes later the new leader's pass charges the ten new silent minutes, and nothing twice.
        clock.advance(timedelta(minutes=10))
        window = floor_to(clock.now(), INTERVAL)
        health = runner_of(second).health["reconcile"]
        await until(lambda: health.window == window and health.last_success, "the new leader's pass")
        assert runner_of(first).health["reconcile"].window != window
        assert (await readyz(second))["leader"] is True
        charges, covered = await pod_charges(engine, uid)
        assert charges == [Decimal("55"), Decimal("10")]
        assert covered == '{["2026-03-18 11:00:00+00","2026-03-18 12:05:00+00")}'
        assert 'timekeeper_running_gpu_pods{namespace="team-a"} 1.0' in (await get(second, "/metrics")).text
        assert "timekeeper_running_gpu_pods{" not in (await get(first, "/metrics")).text
