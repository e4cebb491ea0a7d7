"""Roll-up: raw ledger rows older than the raw window (TIMEKEEPER_LEDGER_RETENTION) are removed, the hourly
per-pod aggregates ingest wrote stay, and every figure the service answers (usage by pod, hour and day,
budget totals) stays the same."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.support.timekeeper import Api, ok
from tests.timekeeper.test_scheduler_jobs import run, scalar
from timekeeper.clock import ManualClock
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

DAY = datetime(2026, 3, 10, tzinfo=UTC)
WINDOWS = (
    {"since": "2026-03-09T00:00:00Z", "until": "2026-03-11T00:00:00Z"},
    # Clipped inside rolled-up hours: the aggregates keep the exact charged time, not just minutes.
    {"since": "2026-03-10T12:03:00.25Z", "until": "2026-03-10T13:20:00Z"},
)


def at(hour: int, minute: int = 0, second: float = 0) -> datetime:
    return DAY + timedelta(hours=hour, minutes=minute, seconds=second)


async def report_history(api: Api) -> None:
    """Intervals across hour and day boundaries, odd shares and microseconds, a retry and an overlap."""
    third = 1 / 3
    reports: list[dict[str, Any]] = [
        dict(pod="a", pod_uid="uid-a", seq=1, start=at(12, 50), end=at(13, 10)),
        dict(pod="a", pod_uid="uid-a", seq=2, start=at(13, 10), end=at(13, 40)),
        dict(pod="a", pod_uid="uid-a", seq=2, start=at(13, 10), end=at(13, 40)),  # a retry
        dict(pod="b", pod_uid="uid-b", seq=1, start=at(12), end=at(12, 7, 13.5), gpu_share=third),
        dict(pod="b", pod_uid="uid-b", seq=2, start=at(12, 5), end=at(12, 30), gpu_share=third),  # overlaps
        dict(pod="c", pod_uid="uid-c", seq=1, start=at(-1, 30), end=at(0, 20), gpu_share=0.125),
        # Ends after the cutoff (14:00): stays raw, beside the folded pieces of its pod's 13:00 hour.
        dict(pod="a", pod_uid="uid-a", seq=3, start=at(13, 55), end=at(14, 5)),
    ]
    for number, body in enumerate(reports):
        ok(await api.report(**body, gpus=figures(number)))


def figures(number: int) -> list[dict[str, Any]]:
    """Each report's own measured figures (odd values, one GPU lost, one report without any), so that the
    roll-up has sums, maxima, energy and statuses of several reports to fold."""
    if number == 4:
        return []
    return [
        {
            "uuid": "GPU-0",
            "sm_util_pct": 80.0 - number * 7.3,
            "sm_util_max_pct": 95.0 - number,
            "mem_used_bytes": 1000 + number * 377,
            "mem_total_bytes": 1 << 34,
            "energy_joules": 1234.567 * (number + 1),
            "status": "partial" if number == 3 else "ok",
        },
        {"uuid": "GPU-1", "sm_util_pct": None, "mem_used_bytes": None, "mem_total_bytes": None}
        | ({"status": "lost"} if number == 5 else {}),
    ]


async def answers(api: Api) -> dict[str, Any]:
    """Everything a reader can see of the namespace's use."""
    seen: dict[str, Any] = {"budget": (await api.budget("team-a"))["used_gpu_minutes"]}
    for number, window in enumerate(WINDOWS):
        for group_by in ("pod", "workload", "hour", "day"):
            answer = ok(await api.get("/namespaces/team-a/usage", group_by=group_by, **window))
            seen[f"{number}/{group_by}/total"] = answer["total_gpu_minutes"]
            rows = answer["rows"]
            if number == 0:
                # Whole hours: every figure, per row and for the namespace, is the same after the roll-up
                # (the report counts only by hour: a report counts once in each aggregate it was folded into).
                seen[f"{number}/{group_by}/answer"] = answer | {
                    "rows": [{k: v for k, v in row.items() if k != "reports"} for row in rows]
                }
            seen[f"{number}/{group_by}/minutes"] = [(row["key"], row["gpu_minutes"]) for row in rows]
            if group_by == "hour" and number == 0:
                # An aggregate is one pod's hour: for whole hours the report counts match too.
                seen["hour/rows"] = answer["rows"]
    return seen


HOURLY = "SELECT * FROM usage_pod_hours ORDER BY pod_key, hour_start, gpu_share, charge_share, model_key"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Pod-hours kept a month: these tests look at the raw rows' removal, with every hour's figures as
    they were (the fold into pod-days, which keeps charges but not the hour, is test_pod_days.py's)."""
    return settings.model_copy(update={"hourly_history": timedelta(days=30)})


async def ledger_rows(connection: AsyncConnection) -> int:
    return int(await scalar(connection, "SELECT count(*) FROM usage_ledger"))


@pytest.fixture
async def history(api: Api, clock: ManualClock) -> dict[str, Any]:
    clock.set(at(14, 10))
    ok(await api.put_budget("team-a", budget_gpu_minutes=1000, period="monthly"))
    await report_history(api)
    before = await answers(api)
    # The retention window (7 days by default) passes; the window (10 minutes by default) starts at 14:00.
    clock.set(at(14, 9) + timedelta(days=7))
    return before


async def test_roll_up_folds_old_rows_and_every_answer_stays_the_same(
    api: Api, app: FastAPI, history: dict[str, Any], connection: AsyncConnection
) -> None:
    raw_before = await ledger_rows(connection)

    result = await run(app, "rollup")

    assert result.window == at(14)
    assert result.detail is not None
    assert result.detail["deleted_rows"] == raw_before - 1
    assert await ledger_rows(connection) == 1  # the row that ended after the cutoff
    assert await answers(api) == history
    # Pod a's 12:00, 13:00 and 14:00 hours, b's 12:00, c's 23:00 and 00:00: one aggregate each, since ingest.
    assert await scalar(connection, "SELECT count(*) FROM usage_pod_hours") == 6


async def test_a_total_hand_computed_from_the_intervals_matches_after_roll_up(
    api: Api, app: FastAPI, history: dict[str, Any]
) -> None:
    await run(app, "rollup")

    answer = ok(await api.get("/namespaces/team-a/usage", group_by="pod", **WINDOWS[0]))

    expected = {
        "a": 20 + 30 + 10,
        "b": (30 * 60) / 3 / 60,  # 12:00-12:30 once, though reported with an overlap
        "c": 50 * 0.125,
    }
    assert {row["key"]: row["gpu_minutes"] for row in answer["rows"]} == pytest.approx(expected, abs=1e-6)


async def test_a_second_roll_up_of_the_same_window_does_nothing(
    api: Api, app: FastAPI, history: dict[str, Any], connection: AsyncConnection
) -> None:
    await run(app, "rollup")
    hourly = (await connection.execute(sa.text(HOURLY))).all()

    assert (await run(app, "rollup")).detail is None

    assert (await connection.execute(sa.text(HOURLY))).all() == hourly
    assert await answers(api) == history


async def test_a_late_retry_of_a_rolled_up_report_charges_nothing(
    api: Api, app: FastAPI, clock: ManualClock, history: dict[str, Any]
) -> None:
    await run(app, "rollup")

    retry = ok(await api.report(pod="a", pod_uid="uid-a", seq=1, start=at(12, 50), end=at(13, 10)))

    assert retry["gpu_minutes"] == 0
    assert await answers(api) == history
    # It ended before the raw window, so it left no ledger row: the next window removes only the
    # 13:55-14:05 one, still changing nothing.
    clock.advance(timedelta(hours=1))
    detail = (await run(app, "rollup")).detail
    assert detail["deleted_rows"] == 1
    assert await answers(api) == history


async def test_late_new_time_in_a_rolled_up_hour_is_added_to_its_aggregate(
    api: Api, app: FastAPI, clock: ManualClock, history: dict[str, Any], connection: AsyncConnection
) -> None:
    await run(app, "rollup")

    late = ok(await api.report(pod="a", pod_uid="uid-a", seq=9, start=at(13, 40), end=at(13, 55)))
    clock.advance(timedelta(hours=1))
    await run(app, "rollup")

    assert late["gpu_minutes"] == 15
    hour = ok(await api.get("/namespaces/team-a/usage", group_by="hour", **WINDOWS[0]))
    minutes = {row["key"]: row["gpu_minutes"] for row in hour["rows"]}
    before = dict(history["0/hour/minutes"])
    assert minutes["2026-03-10T13:00:00Z"] == pytest.approx(before["2026-03-10T13:00:00Z"] + 15, abs=1e-9)
    assert (
        await scalar(
            connection,
            "SELECT count(*) FROM usage_pod_hours h JOIN pod_coverage c ON c.id = h.pod_key "
            "WHERE c.pod_uid = 'uid-a' AND h.hour_start = :hour",
            hour=at(13),
        )
        == 1
    )


async def test_a_period_rebuild_after_roll_up_counts_the_rolled_up_hours(
    api: Api, app: FastAPI, history: dict[str, Any]
) -> None:
    await run(app, "rollup")

    # A change of period kind rebuilds the new period's total from the ledger (raw and rolled up).
    rebuilt = ok(await api.put_budget("team-a", budget_gpu_minutes=1000, period="none"))

    assert rebuilt["used_gpu_minutes"] == pytest.approx(history["budget"], abs=1e-6)
