"""Pod-days: the roll-up folds the pod-hours older than TIMEKEEPER_HOURLY_HISTORY into their days, one
statement and one transaction per hour. Charges read the same on any window (one inside a folded day, or
across the fold's edge, included): GPU-minutes raw and weighted, efficiency's allocation, the export, the
budget and its forecast, and a budget's rebuild. Windows of whole days read every figure the same. A late
report into a folded day is charged once, shows at once, and the next fold adds it into its day."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.support.timekeeper import Api, Tokens, bearer, ok
from tests.timekeeper.conftest import BuiltApps, serving
from tests.timekeeper.test_history import H100, at, report_history
from tests.timekeeper.test_scheduler_jobs import run, scalar
from timekeeper.clock import ManualClock
from timekeeper.domain.weights import model_key
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

# Whole days: every figure reads the same once folded.
WHOLE_DAYS = {"since": "2026-05-03T00:00:00Z", "until": "2026-05-05T00:00:00Z"}
# Windows that cut a folded day (and one across the fold's edge, 14:00): charges read the same.
CUTTING = (
    {"since": "2026-05-04T12:03:00.25Z", "until": "2026-05-04T13:20:00Z"},
    {"since": "2026-05-04T13:30:00Z", "until": "2026-05-04T14:03:00Z"},
    {"since": "2026-05-03T23:45:00Z", "until": "2026-05-04T00:10:00Z"},
)
GROUPINGS = ("pod", "workload", "hour", "day", "model")


@pytest.fixture
async def folding(
    settings: Settings,
    clock: ManualClock,
    connection: AsyncConnection,
    built_apps: BuiltApps,
    tokens: Tokens,
) -> AsyncIterator[tuple[Api, FastAPI]]:
    """An app that keeps no hours past the current one (TIMEKEEPER_HOURLY_HISTORY=0), so the roll-up folds
    every earlier hour, on the test's transaction."""
    assert Settings.model_fields["hourly_history"].default == timedelta(days=2)
    keeping = settings.model_copy(update={"hourly_history": timedelta(0)})
    app = built_apps.app(keeping)
    async with serving(app, keeping, clock, connection):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://timekeeper/api/v1") as client:
            yield Api(client, tokens), app


def charges(usage: dict[str, Any]) -> dict[str, Any]:
    """A usage answer's charges: GPU-minutes, weighted and raw, in total and per row."""
    return {
        "total": (usage["total_gpu_minutes"], usage["total_raw_gpu_minutes"]),
        "rows": [(row["key"], row["gpu_minutes"], row["raw_gpu_minutes"]) for row in usage["rows"]],
    }


async def answers(api: Api, namespace: str) -> dict[str, Any]:
    """What a reader sees of the namespace: every figure over whole days (but per hour: its charges), the
    charges of windows that cut a day, its budget with the forecast, its chargeback rows."""
    seen: dict[str, Any] = {}
    for group_by in GROUPINGS:
        usage = ok(await api.get(f"/namespaces/{namespace}/usage", group_by=group_by, **WHOLE_DAYS))
        seen[f"whole/{group_by}"] = charges(usage) if group_by == "hour" else usage
    seen["whole/efficiency"] = ok(
        await api.client.get(
            f"/namespaces/{namespace}/efficiency", params=WHOLE_DAYS, headers=bearer(api.tokens.reader)
        )
    )
    for number, window in enumerate(CUTTING):
        for group_by in GROUPINGS:
            usage = ok(await api.get(f"/namespaces/{namespace}/usage", group_by=group_by, **window))
            seen[f"{number}/{group_by}"] = charges(usage)
        efficiency = ok(
            await api.client.get(
                f"/namespaces/{namespace}/efficiency", params=window, headers=bearer(api.tokens.reader)
            )
        )
        seen[f"{number}/efficiency"] = [(p["pod"], p["allocated_gpu_minutes"]) for p in efficiency["pods"]]
    budget = await api.budget(namespace)
    seen["budget"] = {k: v for k, v in budget.items() if k in ("used_gpu_minutes", "state", "forecast")}
    exported = await api.client.get(
        "/billing/chargeback",
        params={**WHOLE_DAYS, "namespace": namespace},
        headers=bearer(api.tokens.admin) | {"Accept": "text/csv"},
    )
    assert exported.status_code == 200, exported.text
    seen["chargeback"] = list(csv.DictReader(io.StringIO(exported.text)))
    return seen


async def weighted(api: Api) -> None:
    """The H100 weighs 3 from before the pods ran."""
    weight = {"weight": 3, "effective_from": at(-24).isoformat()}
    ok(
        await api.client.put(
            f"/billing/weights/{model_key(H100)}", json=weight, headers=bearer(api.tokens.admin)
        )
    )


async def rebuilt(api: Api, namespace: str) -> Any:
    """The namespace's used GPU-minutes after its budget's period changes to daily (rebuilt from the
    history), its period set back to monthly (rebuilt again) afterwards."""
    ok(await api.put_budget(namespace, budget_gpu_minutes=1000, period="daily"))
    used = (await api.budget(namespace))["used_gpu_minutes"]
    ok(await api.put_budget(namespace, budget_gpu_minutes=1000, period="monthly"))
    return used


async def test_folded_days_answer_the_same_as_their_hours(
    folding: tuple[Api, FastAPI], clock: ManualClock, connection: AsyncConnection
) -> None:
    api, app = folding
    clock.set(at(-25))
    await weighted(api)
    clock.set(at(14, 10))
    await report_history(api, "team-a")
    rebuilt_before = await rebuilt(api, "team-a")  # the totals as a rebuild gives them, on both sides
    hours_before = await scalar(connection, "SELECT count(*) FROM usage_pod_hours")
    before = await answers(api, "team-a")
    assert before["chargeback"] and before["whole/pod"]["total_mean_sm_util_pct"] is not None

    statements: list[tuple[Any, int]] = []
    sequence: list[str] = []  # the folds and the ends of transactions (here savepoints), in order

    def folds(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if "DELETE FROM usage_pod_hours" in statement:
            statements.append((parameters, cursor.rowcount))
            sequence.append("fold")
        elif statement.startswith("RELEASE SAVEPOINT"):
            sequence.append("commit")

    sync = connection.sync_connection
    assert sync is not None
    sa.event.listen(sync, "after_cursor_execute", folds)
    try:
        rolled = (await run(app, "rollup")).detail
    finally:
        sa.event.remove(sync, "after_cursor_execute", folds)

    # Hours 23:00 (May 3), 00:00, 12:00 and 13:00 folded, one statement each; 14:00 (the current hour)
    # stays.
    assert rolled is not None
    assert len(statements) == rolled["hours_folded"] == 4
    assert [params["hour"] for params, _ in statements] == [at(-1), at(0), at(12), at(13)]
    assert sum(rows for _, rows in statements) == rolled["pod_hours_folded"] == hours_before - 1
    # Each hour committed before the next is folded.
    assert sequence[:8] == ["fold", "commit"] * 4
    assert await scalar(connection, "SELECT count(*) FROM usage_pod_hours") == 1
    days = await connection.execute(
        sa.text("SELECT day_start, reports, reports_continued FROM usage_pod_days ORDER BY 1, 2")
    )
    # Pod c's two days (its report continued into May 4), pod a's day (3 reports, one continued in it from
    # 12:00 counted once), pod b's (2 reports).
    assert [tuple(row) for row in days] == [(at(-24), 1, 0), (at(0), 1, 1), (at(0), 2, 0), (at(0), 3, 0)]

    after = await answers(api, "team-a")
    assert after == before
    assert await rebuilt(api, "team-a") == rebuilt_before
    assert (await run(app, "rollup")).detail is None  # the same window: done
    clock.set(at(14, 20))
    again = (await run(app, "rollup")).detail
    assert again is not None
    assert (again["hours_folded"], again["pod_hours_folded"]) == (0, 0)  # idempotent
    later = await answers(api, "team-a")
    assert {k: v for k, v in later.items() if k != "budget"} == {
        k: v for k, v in before.items() if k != "budget"
    }


async def test_a_late_report_into_a_folded_day_is_charged_once_and_folded_next(
    folding: tuple[Api, FastAPI], clock: ManualClock, connection: AsyncConnection
) -> None:
    api, app = folding
    clock.set(at(10, 1))
    ok(await api.put_budget("team-a", budget_gpu_minutes=1000, period="monthly"))
    for seq, start in enumerate((at(9, 50), at(10)), start=1):
        ok(await api.report(pod="a", pod_uid="uid-a", seq=seq, start=start, minutes=1))
    clock.set(at(14, 30))
    assert (await run(app, "rollup")).detail["hours_folded"] == 2  # type: ignore[index]
    assert await scalar(connection, "SELECT count(*) FROM usage_pod_hours") == 0

    late = ok(await api.report(pod="a", pod_uid="uid-a", seq=3, start=at(9, 55), minutes=2))
    again = ok(await api.report(pod="a", pod_uid="uid-a", seq=3, start=at(9, 55), minutes=2))
    assert (late["gpu_minutes"], again["gpu_minutes"], again["duplicate"]) == (2, 0, True)
    assert await scalar(connection, "SELECT count(*) FROM usage_pod_hours") == 1  # beside its day

    async def seen() -> dict[str, Any]:
        usage = ok(await api.get("/namespaces/team-a/usage", group_by="pod", **WHOLE_DAYS))
        by_hour = ok(await api.get("/namespaces/team-a/usage", group_by="hour", **WHOLE_DAYS))
        return {
            "pod": usage,
            "hour": charges(by_hour),
            "used": (await api.budget("team-a"))["used_gpu_minutes"],
        }

    shown = await seen()
    assert shown["pod"]["total_gpu_minutes"] == pytest.approx(4, abs=1e-9)
    assert shown["pod"]["rows"][0]["reports"] == 3
    assert shown["used"] == pytest.approx(4, abs=1e-9)
    assert shown["hour"]["rows"] == [
        ("2026-05-04T09:00:00Z", pytest.approx(3, abs=1e-9), pytest.approx(3, abs=1e-9)),
        ("2026-05-04T10:00:00Z", pytest.approx(1, abs=1e-9), pytest.approx(1, abs=1e-9)),
    ]
    clock.set(at(14, 40))
    rolled = (await run(app, "rollup")).detail
    assert rolled is not None and (rolled["hours_folded"], rolled["pod_hours_folded"]) == (1, 1)
    assert await scalar(connection, "SELECT count(*) FROM usage_pod_hours") == 0
    assert await scalar(connection, "SELECT reports FROM usage_pod_days") == 3
    assert await seen() == shown
