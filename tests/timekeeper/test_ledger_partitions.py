"""The raw ledger partitioned by UTC day: reports land in the day of their interval's end, a retry beside its
first, the roll-up drops a whole old day (and deletes the older rows of the day the raw window ends in)
without changing any answer, a report for a day with no partition of its own lands in the default
partition, and a late report past the raw window still counts exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.support.postgres import url_string
from tests.support.timekeeper import Api, migrated_database, ok
from tests.timekeeper.test_scheduler_jobs import run, scalar
from timekeeper.app import create_app, current
from timekeeper.clock import ManualClock
from timekeeper.db.session import build_engine, build_sessionmaker
from timekeeper.periodic.jobs import JOBS_BY_NAME, run_job
from timekeeper.settings import Settings
from timekeeper.usage import partitions

pytestmark = pytest.mark.asyncio(loop_scope="session")

# Days after the test database's pre-partitioning partition (it ends the day after the migration ran).
MIDNIGHT = datetime(2030, 2, 10, tzinfo=UTC)
WINDOW = {"since": "2030-02-09T00:00:00Z", "until": "2030-02-12T00:00:00Z"}


def at(minutes: float) -> datetime:
    return MIDNIGHT + timedelta(minutes=minutes)


async def partition_of_rows(connection: AsyncConnection) -> list[tuple[int, str]]:
    rows = await connection.execute(
        sa.text(
            "SELECT seq, CAST(tableoid AS regclass)::text FROM usage_ledger "
            "WHERE pod_uid = 'uid-a' ORDER BY seq"
        )
    )
    return [(row[0], row[1]) for row in rows]


def ours(detail: dict[str, Any]) -> list[str]:
    """The partitions the roll-up dropped of this test's days (those of the database's days go too)."""
    return [name for name in detail["partitions_dropped"] if name.startswith("usage_ledger_p2030")]


async def answers(api: Api) -> dict[str, Any]:
    seen: dict[str, Any] = {"budget": (await api.budget("team-a"))["used_gpu_minutes"]}
    for group_by in ("pod", "hour", "day"):
        seen[group_by] = ok(await api.get("/namespaces/team-a/usage", group_by=group_by, **WINDOW))
    return seen


@pytest.fixture
async def across_midnight(api: Api, app: FastAPI, clock: ManualClock) -> dict[str, Any]:
    """Pod a reports across 2030-02-10 00:00 UTC, with the day partitions made by the upkeep job."""
    clock.set(at(-60))
    detail = (await run(app, "partitions")).detail
    assert detail is not None and "usage_ledger_p20300209" in detail["partitions_created"]
    clock.set(at(10))
    assert (await run(app, "partitions")).detail is not None
    ok(await api.put_budget("team-a", budget_gpu_minutes=1000, period="monthly"))
    for seq, (start, end) in enumerate([(-2, -1), (-1, 0), (0, 1), (-0.5, 0.5)], start=1):
        ok(await api.report(pod="a", pod_uid="uid-a", seq=seq, start=at(start), end=at(end)))
    return await answers(api)


async def test_reports_across_midnight_land_in_the_day_of_their_end(
    across_midnight: dict[str, Any], connection: AsyncConnection
) -> None:
    assert await partition_of_rows(connection) == [
        (1, "usage_ledger_p20300209"),
        (2, "usage_ledger_p20300210"),  # ends at midnight: the next day's
        (3, "usage_ledger_p20300210"),
        (4, "usage_ledger_p20300210"),
    ]
    assert across_midnight["pod"]["total_gpu_minutes"] == pytest.approx(3, abs=1e-9)


async def test_retries_across_midnight_stay_duplicates(
    api: Api, across_midnight: dict[str, Any], connection: AsyncConnection
) -> None:
    for seq, (start, end) in enumerate([(-2, -1), (-1, 0), (0, 1)], start=1):
        retry = ok(await api.report(pod="a", pod_uid="uid-a", seq=seq, start=at(start), end=at(end)))
        assert retry["gpu_minutes"] == 0

    assert len(await partition_of_rows(connection)) == 4
    assert await answers(api) == across_midnight


async def test_the_roll_up_drops_a_whole_old_day_and_no_answer_changes(
    api: Api, app: FastAPI, clock: ManualClock, across_midnight: dict[str, Any], connection: AsyncConnection
) -> None:
    # The retention passes the end of 2030-02-09 but not yet that of 2030-02-10.
    clock.set(at(15) + timedelta(days=7))
    detail = (await run(app, "rollup")).detail

    assert detail is not None
    # The rows of 2030-02-10 that ended by the cutoff (00:10) go by DELETE, its partition stays.
    assert (detail["deleted_rows"], ours(detail)) == (3, ["usage_ledger_p20300209"])
    assert await partition_of_rows(connection) == []
    assert await answers(api) == across_midnight

    clock.set(at(15) + timedelta(days=8))
    detail = (await run(app, "rollup")).detail

    assert detail is not None
    assert (detail["deleted_rows"], ours(detail)) == (0, ["usage_ledger_p20300210"])
    assert await answers(api) == across_midnight


async def test_a_late_report_for_a_dropped_day_past_the_raw_window_counts_once(
    api: Api, app: FastAPI, clock: ManualClock, across_midnight: dict[str, Any], connection: AsyncConnection
) -> None:
    clock.set(at(15) + timedelta(days=7))
    await run(app, "rollup")

    retry = ok(await api.report(pod="a", pod_uid="uid-a", seq=1, start=at(-2), end=at(-1)))
    late = ok(await api.report(pod="a", pod_uid="uid-a", seq=9, start=at(-5), end=at(-3)))
    again = ok(await api.report(pod="a", pod_uid="uid-a", seq=9, start=at(-5), end=at(-3)))

    assert (retry["gpu_minutes"], late["gpu_minutes"], again["gpu_minutes"]) == (0, 2, 0)
    # The pod's coverage decides, not a raw row: they end before the raw window and leave none.
    assert again["duplicate"] is True
    assert await partition_of_rows(connection) == []
    clock.advance(timedelta(hours=1))
    assert (await run(app, "rollup")).detail is not None
    after = await answers(api)
    assert after["pod"]["total_gpu_minutes"] == pytest.approx(3 + 2, abs=1e-9)
    assert after["budget"] == pytest.approx(across_midnight["budget"] + 2, abs=1e-9)


async def test_a_report_for_a_day_without_partition_lands_in_the_default_and_upkeep_leaves_that_day(
    api: Api, app: FastAPI, clock: ManualClock, connection: AsyncConnection
) -> None:
    day = datetime(2030, 6, 1, 12, tzinfo=UTC)  # no upkeep ran for it
    clock.set(day)
    ok(await api.report(pod="a", pod_uid="uid-a", seq=1, start=day - timedelta(minutes=1), end=day))

    assert await partition_of_rows(connection) == [(1, "usage_ledger_default")]
    created = (await run(app, "partitions")).detail
    assert created is not None
    # 2030-06-01 has a row in the default partition: left to it; the days after are created.
    assert created["partitions_created"] == [
        "usage_ledger_p20300602",
        "usage_ledger_p20300603",
        "usage_ledger_p20300604",
    ]
    ok(await api.report(pod="a", pod_uid="uid-a", seq=2, start=day, end=day + timedelta(minutes=1)))
    assert [p for _, p in await partition_of_rows(connection)] == ["usage_ledger_default"] * 2
    assert await scalar(connection, "SELECT count(*) FROM usage_ledger") == 2


@pytest.fixture
def own_database() -> Iterator[URL]:
    """A database of its own: these tests commit, and lock the ledger from several connections."""
    with migrated_database("gtk_partition_locks") as url:
        yield url


async def test_the_drop_never_queues_ingest_behind_a_long_read_and_retries_later(
    own_database: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(partitions, "LOCK_PATIENCE", 1.0)
    engine = build_engine(url_string(own_database), pool_size=3)
    sessionmaker = build_sessionmaker(engine)
    settings = Settings(
        database_url=url_string(own_database), scheduler_enabled=False, ledger_retention=timedelta(days=7)
    )
    clock = ManualClock(at(-60))
    try:
        await run_job(JOBS_BY_NAME["partitions"], sessionmaker, settings, clock, "test")
        async with engine.begin() as connection:
            await connection.execute(sa.text(_LEDGER_ROW), {"seq": 1, "start": at(-2), "end": at(-1)})
        clock.set(at(15) + timedelta(days=7))
        async with engine.connect() as reader, engine.connect() as writer:
            await reader.execute(sa.text("SELECT count(*) FROM usage_ledger"))  # holds it until it ends
            rolling = asyncio.create_task(run_job(JOBS_BY_NAME["rollup"], sessionmaker, settings, clock, "t"))
            await asyncio.sleep(0.3)
            # A report meanwhile: not queued behind the roll-up's ACCESS EXCLUSIVE (it never queues).
            await writer.execute(sa.text("SET lock_timeout = '200ms'"))
            await writer.execute(sa.text(_LEDGER_ROW), {"seq": 2, "start": at(60), "end": at(61)})
            await writer.commit()
            with pytest.raises(DBAPIError, match="could not obtain lock"):
                await rolling
            await reader.rollback()
        rolled = await run_job(JOBS_BY_NAME["rollup"], sessionmaker, settings, clock, "test")

        assert rolled.detail is not None
        assert (
            rolled.detail["deleted_rows"],
            "usage_ledger_p20300209" in rolled.detail["partitions_dropped"],
        ) == (
            0,
            True,
        )
        async with engine.connect() as connection:
            left = await connection.execute(sa.text("SELECT seq FROM usage_ledger"))
            assert left.scalars().all() == [2]
    finally:
        await engine.dispose()


_LEDGER_ROW = (
    "INSERT INTO usage_ledger (namespace, pod, pod_uid, seq, interval_start, interval_end, gpu_share, "
    "charged, gpu_minutes, final, gpus, charge_share) "
    "VALUES ('team-a', 'a', 'uid-a', :seq, :start, :end, 1, tstzmultirange(tstzrange(:start, :end)), 1, "
    "false, '[]', 1)"
)


async def test_a_replica_creates_the_days_ahead_when_it_starts(own_database: URL) -> None:
    settings = Settings(database_url=url_string(own_database), scheduler_enabled=False)
    app = create_app(settings, ManualClock(datetime(2031, 1, 1, 23, 59, tzinfo=UTC)))

    async with app.router.lifespan_context(app), current(app).sessions() as session:
        found = {p.name for p in await partitions.partitions(session)}

    assert {f"usage_ledger_p2031010{day}" for day in range(1, 5)} <= found
    assert "usage_ledger_p20310105" not in found
