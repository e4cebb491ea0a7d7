"""History as aggregates: every charge lands in its pod's hourly aggregates as it is made, so the answers
do not depend on the raw ledger rows, which are kept only for TIMEKEEPER_LEDGER_RETENTION (none at 0); a
report arriving after its raw window still counts exactly once; an aggregate row names its pod and model
by small keys."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.support.timekeeper import Api, Tokens, bearer, ok
from tests.timekeeper.conftest import BuiltApps, serving
from tests.timekeeper.test_scheduler_jobs import run, scalar
from timekeeper.clock import ManualClock
from timekeeper.domain.weights import model_key
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

DAY = datetime(2026, 5, 4, tzinfo=UTC)
H100 = "NVIDIA H100 80GB HBM3"
WINDOWS = (
    {"since": "2026-05-03T00:00:00Z", "until": "2026-05-05T00:00:00Z"},
    {"since": "2026-05-04T12:03:00.25Z", "until": "2026-05-04T13:20:00Z"},  # clipped inside hours
)


def at(hour: int, minute: int = 0, second: float = 0) -> datetime:
    return DAY + timedelta(hours=hour, minutes=minute, seconds=second)


def gpus(util: float | None, name: str | None = None) -> list[dict[str, Any]]:
    figures: dict[str, Any] = {
        "uuid": "GPU-0",
        "sm_util_pct": util,
        "sm_util_max_pct": None if util is None else min(util + 9.5, 100.0),
        "mem_used_bytes": None if util is None else int(util * 1000),
        "mem_total_bytes": 1 << 34,
        "energy_joules": None if util is None else util * 37.5,
    }
    return [figures | ({"name": name} if name else {})]


# Across hour and day boundaries, odd shares and seconds, a retry and overlaps, one weighted model.
HISTORY: tuple[dict[str, Any], ...] = (
    dict(pod="a", seq=1, start=at(12, 50), end=at(13, 10), gpus=gpus(71.5, H100)),
    dict(pod="a", seq=2, start=at(13, 10), end=at(13, 45), gpus=gpus(12.25, H100)),
    dict(pod="a", seq=2, start=at(13, 10), end=at(13, 45), gpus=gpus(12.25, H100)),  # a retry
    dict(pod="a", seq=3, start=at(13, 40), end=at(14, 5), gpus=gpus(30.0, H100)),  # overlaps
    dict(pod="b", seq=1, start=at(12), end=at(12, 7, 13.5), gpu_share=1 / 3, gpus=gpus(None)),
    dict(pod="b", seq=2, start=at(12, 5), end=at(12, 30), gpu_share=1 / 3, gpus=gpus(88.0)),
    dict(pod="c", seq=1, start=at(-1, 30), end=at(0, 20), gpu_share=0.125, gpus=gpus(5.0)),
)


@asynccontextmanager
async def api_keeping(
    retention: timedelta,
    settings: Settings,
    clock: ManualClock,
    connection: AsyncConnection,
    built_apps: BuiltApps,
    tokens: Tokens,
) -> AsyncIterator[tuple[Api, FastAPI]]:
    """The API of an app that keeps raw rows for `retention`, on the test's transaction, and the app."""
    keeping = settings.model_copy(update={"ledger_retention": retention})
    app = built_apps.app(keeping)
    async with serving(app, keeping, clock, connection):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://timekeeper/api/v1") as client:
            yield Api(client, tokens), app


async def report_history(api: Api, namespace: str) -> list[dict[str, Any]]:
    ok(await api.put_budget(namespace, budget_gpu_minutes=1000, period="monthly"))
    return [
        ok(await api.report(namespace=namespace, pod_uid=f"{namespace}-{body['pod']}", **body))
        for body in HISTORY
    ]


async def answers(api: Api, namespace: str) -> dict[str, Any]:
    """Everything a reader sees of the namespace's use: usage every way, efficiency, its budget and its
    chargeback rows, its own name taken out."""
    seen: dict[str, Any] = {}
    for number, window in enumerate(WINDOWS):
        for group_by in ("pod", "workload", "hour", "day", "model"):
            usage = ok(await api.get(f"/namespaces/{namespace}/usage", group_by=group_by, **window))
            seen[f"{number}/{group_by}"] = {k: v for k, v in usage.items() if k != "namespace"}
        efficiency = await api.client.get(
            f"/namespaces/{namespace}/efficiency", params=window, headers=bearer(api.tokens.reader)
        )
        seen[f"{number}/efficiency"] = {k: v for k, v in ok(efficiency).items() if k != "namespace"}
    budget = await api.budget(namespace)
    seen["budget"] = {k: v for k, v in budget.items() if k in ("used_gpu_minutes", "state", "forecast")}
    exported = await api.client.get(
        "/billing/chargeback",
        params={**WINDOWS[0], "namespace": namespace},
        headers=bearer(api.tokens.admin) | {"Accept": "text/csv"},
    )
    assert exported.status_code == 200, exported.text
    seen["chargeback"] = [
        {k: v for k, v in row.items() if k != "namespace"}
        for row in csv.DictReader(io.StringIO(exported.text))
        if row["namespace"] == namespace
    ]
    return seen


async def test_no_raw_window_writes_no_raw_row_and_every_answer_is_the_same(
    settings: Settings,
    clock: ManualClock,
    connection: AsyncConnection,
    built_apps: BuiltApps,
    tokens: Tokens,
) -> None:
    found: dict[str, Any] = {}
    outcomes: dict[str, list[dict[str, Any]]] = {}
    for namespace, retention in (("kept", timedelta(days=7)), ("none", timedelta(0))):
        async with api_keeping(retention, settings, clock, connection, built_apps, tokens) as (api, _):
            if namespace == "kept":  # weighted from before the pods ran, as an admin would have
                clock.set(at(-25))
                weight = {"weight": 3, "effective_from": at(-24).isoformat()}
                ok(
                    await api.client.put(
                        f"/billing/weights/{model_key(H100)}", json=weight, headers=bearer(api.tokens.admin)
                    )
                )
            clock.set(at(14, 10))
            outcomes[namespace] = await report_history(api, namespace)
            found[namespace] = await answers(api, namespace)

    raw = dict(
        (await connection.execute(sa.text("SELECT namespace, count(*) FROM usage_ledger GROUP BY 1"))).all()
    )
    assert raw == {"kept": len(HISTORY) - 1}  # the retry is not written again
    # The retry is a duplicate either way: its raw row, or (kept none) its pod's last seq fully charged.
    assert outcomes["none"] == outcomes["kept"]
    assert outcomes["none"][2]["duplicate"] is True
    assert found["none"] == found["kept"]
    pods = {row["key"]: row["gpu_minutes"] for row in found["kept"]["0/pod"]["rows"]}
    assert pods == pytest.approx({"a": 3 * (20 + 35 + 20), "b": 30 / 3, "c": 50 * 0.125}, abs=1e-6)


@pytest.fixture
async def hour_kept(
    settings: Settings,
    clock: ManualClock,
    connection: AsyncConnection,
    built_apps: BuiltApps,
    tokens: Tokens,
) -> AsyncIterator[tuple[Api, FastAPI]]:
    """Raw rows kept an hour: the default."""
    async with api_keeping(timedelta(hours=1), settings, clock, connection, built_apps, tokens) as kept:
        yield kept


async def test_a_late_report_after_its_raw_window_is_charged_exactly_once(
    hour_kept: tuple[Api, FastAPI], clock: ManualClock, connection: AsyncConnection
) -> None:
    """Long after a pod's reports, their raw rows are gone; a late report for time not yet charged is
    charged, its retry and a retry of an old report are not."""
    api, app = hour_kept
    assert Settings.model_fields["ledger_retention"].default == timedelta(hours=1)
    clock.set(at(10, 1))
    ok(await api.put_budget("team-a", budget_gpu_minutes=1000, period="monthly"))
    for seq, start in enumerate((at(9, 50), at(10)), start=1):
        ok(await api.report(pod="a", pod_uid="uid-a", seq=seq, start=start, minutes=1))
    clock.set(at(14, 30))
    assert (await run(app, "rollup")).detail is not None
    assert await scalar(connection, "SELECT count(*) FROM usage_ledger WHERE pod_uid = 'uid-a'") == 0

    late = ok(await api.report(pod="a", pod_uid="uid-a", seq=3, start=at(9, 55), minutes=2))
    again = ok(await api.report(pod="a", pod_uid="uid-a", seq=3, start=at(9, 55), minutes=2))
    old = ok(await api.report(pod="a", pod_uid="uid-a", seq=1, start=at(9, 50), minutes=1))

    assert (late["gpu_minutes"], again["gpu_minutes"], old["gpu_minutes"]) == (2, 0, 0)
    assert (late["duplicate"], again["duplicate"]) == (False, True)
    assert await scalar(connection, "SELECT count(*) FROM usage_ledger WHERE pod_uid = 'uid-a'") == 0
    usage = ok(await api.get("/namespaces/team-a/usage", group_by="hour", **WINDOWS[0]))
    assert usage["total_gpu_minutes"] == pytest.approx(4, abs=1e-9)
    assert [(row["key"], row["reports"]) for row in usage["rows"]] == [
        ("2026-05-04T09:00:00Z", 2),
        ("2026-05-04T10:00:00Z", 1),
    ]
    assert (await api.budget("team-a"))["used_gpu_minutes"] == pytest.approx(4, abs=1e-9)


async def test_an_aggregate_row_names_its_pod_and_model_by_small_keys(
    api: Api, clock: ManualClock, connection: AsyncConnection
) -> None:
    clock.set(at(14, 10))
    for body in HISTORY:
        ok(await api.report(pod_uid=f"uid-{body['pod']}", **body))

    columns = dict(
        (
            await connection.execute(
                sa.text(
                    "SELECT column_name, data_type FROM information_schema.columns "
                    "WHERE table_name = 'usage_pod_hours'"
                )
            )
        ).all()
    )
    rows = (
        await connection.execute(
            sa.text(
                "SELECT c.pod_uid, c.namespace, m.name AS model, h.hour_start, h.reports "
                "FROM usage_pod_hours h JOIN pod_coverage c ON c.id = h.pod_key "
                "LEFT JOIN usage_models m ON m.id = h.model_key "
                "ORDER BY 1, 4"
            )
        )
    ).all()

    assert (columns["pod_key"], columns["model_key"]) == ("integer", "smallint")
    assert "text" not in columns.values()  # no namespace, pod or model name repeated on every row
    assert [(row.pod_uid, row.model, row.hour_start.hour, row.reports) for row in rows] == [
        ("uid-a", model_key(H100), 12, 1),
        ("uid-a", model_key(H100), 13, 3),  # seq 1 from 13:00, seq 2, seq 3's 13:45-14:00
        ("uid-a", model_key(H100), 14, 1),
        ("uid-b", None, 12, 2),
        ("uid-c", None, 23, 1),
        ("uid-c", None, 0, 1),
    ]
    assert {row.namespace for row in rows} == {"team-a"}
