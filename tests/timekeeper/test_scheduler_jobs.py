"""The scheduler's jobs, driven directly with the test's clock: each one's rule, and that a second run of
the same window changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.support.timekeeper import Api, ok
from timekeeper.app import current
from timekeeper.clock import ManualClock
from timekeeper.periodic.jobs import JOBS_BY_NAME, JobResult, floor_to, run_job

pytestmark = pytest.mark.asyncio(loop_scope="session")

MARCH_30 = datetime(2026, 3, 30, 22, 0, tzinfo=UTC)
APRIL_1 = datetime(2026, 4, 1, 0, 0, 30, tzinfo=UTC)


async def run(app: FastAPI, job: str) -> JobResult:
    context = current(app)
    return await run_job(JOBS_BY_NAME[job], context.sessions, context.settings, context.clock, "test-replica")


async def scalar(connection: AsyncConnection, sql: str, **params: Any) -> Any:
    return (await connection.execute(sa.text(sql), params)).scalar_one()


async def events(connection: AsyncConnection, namespace: str) -> list[tuple[str | None, str]]:
    result = await connection.execute(
        sa.text("SELECT old_state, new_state FROM budget_events WHERE namespace = :ns ORDER BY id"),
        {"ns": namespace},
    )
    return [(row.old_state, row.new_state) for row in result]


async def version(connection: AsyncConnection) -> int:
    return int(await scalar(connection, "SELECT version FROM admission_version"))


# -- roll-over -------------------------------------------------------------------------------------------


async def test_roll_over_at_a_month_boundary_starts_from_zero_and_records_the_transition(
    api: Api, app: FastAPI, clock: ManualClock, connection: AsyncConnection
) -> None:
    clock.set(MARCH_30)
    ok(await api.put_budget("team-a", budget_gpu_minutes=10, period="monthly"))
    ok(await api.report(seq=1, start=MARCH_30 - timedelta(minutes=12), minutes=12))
    assert (await api.budget("team-a"))["state"] == "exhausted"
    before = await version(connection)

    clock.set(APRIL_1)
    result = await run(app, "rollover")

    assert result.window == datetime(2026, 4, 1, tzinfo=UTC)
    assert result.detail is not None
    budget = await api.budget("team-a")
    assert (budget["used_gpu_minutes"], budget["state"], budget["period"]["start"]) == (
        0,
        "in_budget",
        "2026-04-01T00:00:00Z",
    )
    assert (await events(connection, "team-a"))[-1] == ("exhausted", "in_budget")
    assert await version(connection) == before + 1
    # The snapshot the webhooks poll says so too.
    snapshot = ok(await api.get("/admission-state"))
    assert snapshot["namespaces"]["team-a"]["state"] == "in_budget"
    # March keeps its total: the roll-over changes state, never the books.
    assert (
        await scalar(
            connection,
            "SELECT used_gpu_minutes FROM usage_totals WHERE namespace = 'team-a' AND period_start = :start",
            start=datetime(2026, 3, 1, tzinfo=UTC),
        )
        == 12
    )


async def test_a_second_roll_over_of_the_same_day_does_nothing(
    api: Api, app: FastAPI, clock: ManualClock, connection: AsyncConnection
) -> None:
    clock.set(MARCH_30)
    ok(await api.put_budget("team-a", budget_gpu_minutes=10, period="monthly"))
    ok(await api.report(seq=1, start=MARCH_30 - timedelta(minutes=12), minutes=12))
    clock.set(APRIL_1)
    assert (await run(app, "rollover")).detail is not None
    after_first = (await version(connection), await events(connection, "team-a"))

    clock.advance(timedelta(hours=5))
    again = await run(app, "rollover")

    assert again.detail is None
    assert (await version(connection), await events(connection, "team-a")) == after_first
    assert await scalar(connection, "SELECT count(*) FROM job_runs WHERE job = 'rollover'") == 1


async def test_grants_expire_with_their_period(
    api: Api, app: FastAPI, clock: ManualClock, connection: AsyncConnection
) -> None:
    clock.set(MARCH_30)
    ok(await api.put_budget("team-a", budget_gpu_minutes=10, period="monthly"))
    ok(await api.grant("team-a", 5))
    ok(await api.report(seq=1, start=MARCH_30 - timedelta(minutes=13), minutes=13))
    assert (await api.budget("team-a"))["state"] == "warning"  # 13 of 15

    clock.set(APRIL_1)
    await run(app, "rollover")

    budget = await api.budget("team-a")
    assert (budget["granted_gpu_minutes"], budget["remaining_gpu_minutes"], budget["state"]) == (
        0,
        10,
        "in_budget",
    )
    assert (await events(connection, "team-a"))[-1] == ("warning", "in_budget")


async def test_roll_over_moves_daily_namespaces_and_leaves_monthly_ones_inside_their_period(
    api: Api, app: FastAPI, clock: ManualClock, connection: AsyncConnection
) -> None:
    day = datetime(2026, 3, 18, 20, 0, tzinfo=UTC)
    clock.set(day + timedelta(minutes=11))
    ok(await api.put_budget("daily", budget_gpu_minutes=10, period="daily"))
    ok(await api.put_budget("monthly", budget_gpu_minutes=10, period="monthly"))
    for namespace in ("daily", "monthly"):
        ok(await api.report(namespace=namespace, pod_uid=f"uid-{namespace}", seq=1, start=day, minutes=11))

    clock.set(datetime(2026, 3, 19, 0, 1, tzinfo=UTC))
    await run(app, "rollover")

    assert [(await api.budget(ns))["state"] for ns in ("daily", "monthly")] == ["in_budget", "exhausted"]
    assert (await events(connection, "monthly"))[-1] == ("in_budget", "exhausted")


# -- budget-state transitions ----------------------------------------------------------------------------


async def test_every_state_transition_is_an_event_and_the_sweep_publishes_a_new_period(
    api: Api, app: FastAPI, clock: ManualClock, connection: AsyncConnection
) -> None:
    clock.set(MARCH_30)
    ok(await api.put_budget("team-a", budget_gpu_minutes=10, period="monthly", warn_at_fraction=0.5))
    start = MARCH_30 - timedelta(hours=1)
    for seq, minutes in enumerate((2, 4, 5), start=1):  # 2, 6 (warning), 11 (exhausted)
        ok(await api.report(seq=seq, start=start + timedelta(minutes=10 * seq), minutes=minutes))
    ok(await api.grant("team-a", 20))  # back: 11 of 30
    assert await events(connection, "team-a") == [
        (None, "in_budget"),
        ("in_budget", "warning"),
        ("warning", "exhausted"),
        ("exhausted", "in_budget"),
    ]
    ok(await api.report(seq=4, start=start + timedelta(minutes=40), minutes=10))  # 21 of 30: warning
    before = await version(connection)

    clock.set(APRIL_1)
    swept = await run(app, "states")

    assert swept.window == floor_to(APRIL_1, current(app).settings.states_interval)
    assert (await events(connection, "team-a"))[-2:] == [("in_budget", "warning"), ("warning", "in_budget")]
    assert await version(connection) == before + 1
    assert (await run(app, "states")).detail is None  # same window


async def test_a_sweep_that_changes_nothing_keeps_the_version(
    api: Api, app: FastAPI, clock: ManualClock, connection: AsyncConnection
) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=10))
    ok(await api.report(seq=1, start=clock.now() - timedelta(minutes=5), minutes=2))
    before = (await version(connection), await events(connection, "team-a"))

    assert (await run(app, "states")).detail == {}

    assert (await version(connection), await events(connection, "team-a")) == before


# -- close-out -------------------------------------------------------------------------------------------


async def running(connection: AsyncConnection) -> list[str]:
    result = await connection.execute(
        sa.text(
            "SELECT pod FROM pod_coverage WHERE NOT final "
            "AND (closed_at IS NULL OR closed_at <= last_report_at) ORDER BY pod"
        )
    )
    return list(result.scalars())


async def test_pods_that_stopped_reporting_are_closed_out(
    api: Api, app: FastAPI, clock: ManualClock, connection: AsyncConnection
) -> None:
    settings = current(app).settings
    silence = settings.report_interval * settings.closeout_after_intervals
    start = clock.now()
    earlier = start - timedelta(minutes=1)
    ok(await api.report(pod="silent", pod_uid="uid-silent", seq=1, start=earlier))
    ok(await api.report(pod="done", pod_uid="uid-done", seq=1, start=earlier, final=True))
    clock.advance(silence + timedelta(seconds=1))
    ok(await api.report(pod="alive", pod_uid="uid-alive", seq=1, start=start))

    result = await run(app, "closeout")

    assert result.detail is not None
    assert [pod["pod"] for pod in result.detail["closed"]] == ["silent"]
    assert result.detail["running"] == 1
    assert await running(connection) == ["alive"]


async def test_a_pod_just_inside_the_silence_threshold_keeps_running(
    api: Api, app: FastAPI, clock: ManualClock, connection: AsyncConnection
) -> None:
    settings = current(app).settings
    ok(await api.report(pod="slow", pod_uid="uid-slow", seq=1, start=clock.now() - timedelta(minutes=1)))
    clock.advance(settings.report_interval * settings.closeout_after_intervals - timedelta(seconds=1))

    assert (await run(app, "closeout")).detail == {"closed": [], "running": 1}


async def test_a_closed_out_pod_that_reports_again_runs_again_and_its_time_is_charged(
    api: Api, app: FastAPI, clock: ManualClock, connection: AsyncConnection
) -> None:
    start = clock.now() - timedelta(minutes=1)
    ok(await api.report(pod="flaky", pod_uid="uid-flaky", seq=1, start=start))
    clock.advance(timedelta(hours=1))
    await run(app, "closeout")
    assert await running(connection) == []

    late = ok(await api.report(pod="flaky", pod_uid="uid-flaky", seq=2, start=start + timedelta(minutes=1)))

    assert late["gpu_minutes"] == 1
    assert await running(connection) == ["flaky"]
    # The same close-out window again changes nothing, though the pod is running now.
    assert (await run(app, "closeout")).detail is None
    assert await running(connection) == ["flaky"]
