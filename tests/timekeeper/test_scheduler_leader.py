"""Leadership through a PostgreSQL advisory lock, and windows claimed once even by racing runners, on a
database of the test's own (these commit)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tests.support.postgres import url_string
from tests.support.replicas import scheduler_process
from tests.support.timekeeper import migrated_database
from timekeeper.clock import ManualClock, SystemClock
from timekeeper.db.session import build_engine, build_sessionmaker
from timekeeper.periodic.jobs import JOBS_BY_NAME, run_job
from timekeeper.periodic.leader import LeaderElection
from timekeeper.periodic.runner import PeriodicRunner
from timekeeper.settings import Settings

on_session_loop = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module")
def own_database() -> Iterator[URL]:
    with migrated_database("gtk_leader") as url:
        yield url


@pytest.fixture
def fast_settings(own_database: URL) -> Settings:
    fast = 0.2
    return Settings(
        database_url=url_string(own_database),
        leader_retry_interval=fast,
        # Fast rounds, but a check slow on a loaded machine must not hand leadership over on its own (the
        # tests move it by killing the lock's session, which fails the check at once); the timeout
        # itself is tested on its own below.
        leader_check_timeout=timedelta(seconds=10),
        rollover_interval=fast,
        states_interval=fast,
        closeout_interval=fast,
        rollup_interval=fast,
        partitions_interval=fast,
    )


@pytest.fixture
async def sessionmaker(fast_settings: Settings) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    assert fast_settings.database_url is not None
    engine = build_engine(fast_settings.database_url, pool_size=4)
    yield build_sessionmaker(engine)
    await engine.dispose()


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 15
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


@on_session_loop
async def test_one_replica_leads_and_another_takes_over_when_its_session_dies(
    fast_settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    assert fast_settings.database_url is not None
    registries = [CollectorRegistry(), CollectorRegistry()]
    first, second = (
        PeriodicRunner(fast_settings.database_url, sessionmaker, fast_settings, SystemClock(), registry)
        for registry in registries
    )
    first.start()
    await until(lambda: first.leading, "the first replica leads")
    second.start()
    await until(lambda: first.health["states"].outcome == "ok", "the leader runs the jobs")
    try:
        assert not second.leading
        assert all(health.last_run is None for health in second.health.values())

        # The leader's lock session ends (its process died, or the network took it): it stops, the
        # other one takes over.
        async with sessionmaker() as session:
            killed = await session.execute(
                sa.text(
                    "SELECT pg_terminate_backend(l.pid) FROM pg_locks l "
                    "JOIN pg_database d ON d.oid = l.database AND d.datname = current_database() "
                    "WHERE l.locktype = 'advisory' AND l.granted "
                    "AND ((l.classid::bigint << 32) | l.objid::bigint) = :key"
                ),
                {"key": fast_settings.scheduler_lock_key},
            )
            assert killed.scalars().all() == [True]
        await until(lambda: second.leading, "the second replica takes over")
        await until(lambda: not first.leading, "the first one knows it no longer leads")
        await until(lambda: second.health["closeout"].outcome == "ok", "the new leader runs the jobs")

        assert not first.leading
        assert b"timekeeper_scheduler_leader" in generate_latest(registries[1])
        assert first.status()["leader"] is False and second.status()["leader"] is True
    finally:
        await first.stop()
        await second.stop()


@on_session_loop
async def test_a_replica_stopped_just_as_a_round_ends_stops(fast_settings: Settings) -> None:
    """A stop (the task cancelled) that arrives in the very turn an election round finishes is not
    lost. With asyncio.wait_for around the round (Python 3.11) it was: the round's own task had finished,
    wait_for returned its result instead of the cancellation, the loop went on leading and the runner's
    stop() waited for it forever. Here the round that elects the replica cancels it."""
    assert fast_settings.database_url is not None

    async def elected() -> None:
        election_task.cancel()

    async def lost() -> None:
        return None

    election = LeaderElection(fast_settings.database_url, 4242, 0.2, elected, lost)
    election_task = asyncio.create_task(election.run())
    try:
        # Bounded, so the old hang is a failure of this test rather than the suite's timeout.
        await asyncio.wait({election_task}, timeout=15)
        assert election_task.cancelled()
        assert not election.leading
    finally:
        election_task.cancel()
        await asyncio.gather(election_task, return_exceptions=True)


@on_session_loop
async def test_a_leader_whose_check_times_out_steps_down_and_competes_again(
    fast_settings: Settings,
) -> None:
    """A check slower than its timeout counts as a lost connection: the leader stops leading (releasing
    the lock with its connection) and takes it again at a later round. A zero timeout expires at the
    check's first wait, whatever the machine's load."""
    assert fast_settings.database_url is not None
    events: list[str] = []

    async def elected() -> None:
        events.append("elected")

    async def lost() -> None:
        events.append("lost")

    election = LeaderElection(fast_settings.database_url, 4245, 0.2, elected, lost, check_seconds=10)
    task = asyncio.create_task(election.run())
    try:
        await until(lambda: election.leading, "elected")
        election.check_seconds = 0
        await until(lambda: events[-1:] == ["lost"], "the leader steps down")
        election.check_seconds = 10
        await until(lambda: election.leading, "elected again")
        assert events[:3] == ["elected", "lost", "elected"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@on_session_loop
async def test_racing_runs_of_one_window_do_the_work_once(
    fast_settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    job = JOBS_BY_NAME["rollup"]
    clock = ManualClock(datetime(2030, 1, 1, 12, 0, 0, 100, tzinfo=UTC))  # a window nobody ran yet

    results = await asyncio.gather(
        *(run_job(job, sessionmaker, fast_settings, clock, f"replica-{n}") for n in range(4))
    )

    assert len({result.window for result in results}) == 1
    assert [result.detail is not None for result in results].count(True) == 1
    async with sessionmaker() as session:
        recorded = await session.execute(
            sa.text("SELECT replica FROM job_runs WHERE job = 'rollup' AND window_start = :window"),
            {"window": results[0].window},
        )
        [winner] = [n for n, result in enumerate(results) if result.detail is not None]
        assert recorded.scalars().all() == [f"replica-{winner}"]


@pytest.mark.e2e  # a real `python -m` process over real sockets
def test_the_scheduler_runs_as_a_process_of_its_own(own_database: URL, tmp_path: Path) -> None:
    env = {
        "TIMEKEEPER_SCHEDULER_LOCK_KEY": "42",  # not the other tests' lock
        "TIMEKEEPER_LEADER_RETRY_INTERVAL": "0.2",
        "TIMEKEEPER_STATES_INTERVAL": "0.2",
    }
    with scheduler_process(own_database, env, tmp_path / "scheduler.log") as scheduler:
        scheduler.wait_for_metric(
            'timekeeper_job_last_outcome{job="states",outcome="ok"} 1.0',
            "the scheduler process to lead and run its jobs",
        )
    engine = sa.create_engine(url_string(own_database), poolclass=sa.NullPool)
    with engine.connect() as connection:
        replicas = connection.execute(sa.text("SELECT DISTINCT replica FROM job_runs WHERE job = 'states'"))
        assert scheduler.replica in replicas.scalars().all()
    engine.dispose()


@on_session_loop
async def test_a_sweep_racing_a_report_never_writes_back_an_older_state(
    fast_settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    now = datetime.now(UTC)
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    async with sessionmaker() as setup, setup.begin():
        await setup.execute(
            sa.text(
                "INSERT INTO namespace_budgets (namespace, budget_gpu_minutes, period, warn_at_fraction) "
                "VALUES ('racing', 10, 'monthly', 0.8)"
            )
        )
        await setup.execute(sa.text("INSERT INTO namespace_status VALUES ('racing', 'in_budget')"))
    # A report's transaction, as ingest makes it: the period's total, then the namespace's state.
    async with sessionmaker() as report, report.begin():
        await report.execute(
            sa.text(
                "INSERT INTO usage_totals (namespace, period_kind, period_start, used_gpu_minutes) "
                "VALUES ('racing', 'monthly', :month, 12)"
            ),
            {"month": month},
        )
        await report.execute(
            sa.text("UPDATE namespace_status SET state = 'exhausted' WHERE namespace = 'racing'")
        )
        sweep = asyncio.create_task(
            run_job(JOBS_BY_NAME["states"], sessionmaker, fast_settings, ManualClock(now), "sweeper")
        )
        await asyncio.sleep(0.3)  # the sweep is under way, waiting on the report's row
        assert not sweep.done()
    await sweep

    async with sessionmaker() as session:
        state = await session.execute(
            sa.text("SELECT state FROM namespace_status WHERE namespace = 'racing'")
        )
        assert state.scalar_one() == "exhausted"
