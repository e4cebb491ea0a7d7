"""How PostgreSQL plans the ingest statements and the budget read, as a production server would: with the
tables at a cluster's size and analysed, each statement finds its rows by index and keeps one plan.

psycopg prepares a statement after five runs; PostgreSQL then keeps its generic plan where that looks no
dearer than planning each run anew (docs/performance.md, "Plans"). The test server runs without
autovacuum, so the fixture runs the ANALYZE a production server's autovacuum would have run after the
tables grew. No planner setting is changed: what is checked is what production gets.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.ext.asyncio import AsyncConnection

from timekeeper.budgets.burn import window_parameters
from timekeeper.budgets.repository import figures_of, figures_parameters
from timekeeper.db.lists import arity, array_parameters
from timekeeper.db.pipeline import pipeline_sql
from timekeeper.usage import repository
from timekeeper.usage.charge_inputs import (
    CHARGE_INPUTS,
    charge_inputs_parameters,
    weights,
    weights_parameters,
)
from timekeeper.usage.repository import batch_json

NOW = datetime(2026, 3, 18, 12, 0, tzinfo=UTC)
START, END = NOW - timedelta(minutes=2), NOW - timedelta(minutes=1, seconds=30)
POD = {
    "pod_uid": "uid-1",
    "namespace": "team-a",
    "pod": "trainer",
    "seq": 1,
    "interval_start": START,
    "interval_end": END,
    "final": False,
    "gpu_model": "NVIDIA-H100",
}
REPORT = {
    **POD,
    "gpu_share": "0.5",
    "gpu_minutes": "0.25",
    "charge_share": "0.5",
    "mean_sm_util_pct": 50.0,
    "gpus": [],
    "peak_sm_util_pct": 50.0,
    "mem_used_bytes": 1,
    "mean_power_w": None,
    "gpu_status_bits": 0,
    "covers": True,
}
# Tables small whatever the cluster's size, which PostgreSQL may rightly read whole: the default budget
# (one row), the pools (an admin's few, each selector matched against a namespace's labels), the charge
# bases, the GPU weights (an admin's models and their changes) and the models' keys (a cluster's few).
READ_WHOLE = {"default_budget", "budget_pools", "charge_basis", "gpu_weights", "usage_models"}
RUNS = 8  # psycopg prepares on the fifth run; PostgreSQL chooses its kept plan on the sixth

# A large cluster's tables: 10,000 namespaces (5,000 with budgets of their own, 1,000 listed in a pool,
# each with a monthly total and 1,000 with six hours of burn buckets), 5,000 pods with four reports each,
# labelled namespaces, 20 weighted GPU models; a day of hourly aggregates per pod.
_GROWN = (
    "INSERT INTO namespace_status (namespace, state) SELECT 'ns-' || i, 'in_budget' "
    "FROM generate_series(1, 10000) AS i",
    "INSERT INTO namespace_budgets (namespace, budget_gpu_minutes, period, warn_at_fraction, updated_at, "
    "updated_by) SELECT 'ns-' || i, 1000, 'monthly', 0.8, now(), 'test' FROM generate_series(1, 5000) AS i",
    "INSERT INTO usage_totals (namespace, period_kind, period_start, used_gpu_minutes, granted_gpu_minutes) "
    "SELECT 'ns-' || i, 'monthly', date_trunc('month', now()), 1, 0 FROM generate_series(1, 10000) AS i",
    "INSERT INTO usage_burn (namespace, bucket_start, gpu_minutes) "
    "SELECT 'ns-' || i, to_timestamp(1773835200 - 300 * b), 1 "
    "FROM generate_series(1, 1000) AS i, generate_series(0, 71) AS b",
    # Per GPU model: every namespace's monthly totals of two models, and the burn of 1,000 on one.
    "INSERT INTO usage_model_totals (namespace, period_kind, period_start, model, used_gpu_minutes) "
    "SELECT 'ns-' || i, 'monthly', date_trunc('month', now()), 'MODEL-' || m, 1 "
    "FROM generate_series(1, 10000) AS i, generate_series(1, 2) AS m",
    "INSERT INTO usage_model_burn (namespace, model, bucket_start, gpu_minutes) "
    "SELECT 'ns-' || i, 'MODEL-1', to_timestamp(1773835200 - 300 * b), 1 "
    "FROM generate_series(1, 1000) AS i, generate_series(0, 71) AS b",
    "INSERT INTO pod_coverage (pod_uid, namespace, pod, covered, last_seq, last_report_at, final) "
    "SELECT 'uid-' || i, 'ns-' || (i % 10000), 'pod-' || i, "
    "tstzmultirange(tstzrange(now() - interval '2 minutes', now())), 4, now(), false "
    "FROM generate_series(2, 5000) AS i",
    "INSERT INTO usage_ledger (namespace, pod, pod_uid, seq, interval_start, interval_end, gpu_share, "
    "charged, gpu_minutes, final, gpus, charge_share) "
    "SELECT 'ns-' || (i % 10000), 'pod-' || i, 'uid-' || i, s, t, t + interval '30 seconds', 1, "
    "tstzmultirange(tstzrange(t, t + interval '30 seconds')), 0.5, false, '[]', 1 "
    "FROM generate_series(2, 5000) AS i, generate_series(1, 4) AS s, "
    "LATERAL (SELECT now() - s * interval '30 seconds' AS t) AS at",
    "INSERT INTO usage_models (name) SELECT 'MODEL-' || m FROM generate_series(1, 20) AS m",
    "INSERT INTO usage_pod_hours (pod_key, hour_start, gpu_share, charge_share, model_key, charged, reports) "
    "SELECT c.id, h, 1, 1, 1, tstzmultirange(tstzrange(h, h + interval '1 hour')), 120 "
    "FROM pod_coverage c, LATERAL generate_series(date_trunc('hour', now()) - interval '23 hours', "
    "date_trunc('hour', now()), interval '1 hour') AS h",
    "INSERT INTO budget_pools (name, budget_gpu_minutes, period, warn_at_fraction, namespace_selector, "
    "updated_by) VALUES ('research', 1000, 'monthly', 0.8, '{\"team\": \"research\"}', 'test'), "
    "('listed', 1000, 'monthly', 0.8, NULL, 'test')",
    "INSERT INTO budget_pool_members (namespace, pool) SELECT 'ns-' || i, 'listed' "
    "FROM generate_series(9001, 10000) AS i",
    "INSERT INTO namespace_labels (namespace, labels, seen_at) SELECT 'ns-' || i, "
    "jsonb_build_object('team', CASE WHEN i % 10 = 0 THEN 'research' ELSE 'other' END), now() "
    "FROM generate_series(1, 10000) AS i",
    "INSERT INTO gpu_weights (model, effective_from, weight, set_by) "
    "SELECT 'MODEL-' || m, now() - d * interval '1 day', 2, 'test' "
    "FROM generate_series(1, 20) AS m, generate_series(1, 10) AS d",
)


@pytest.fixture
async def grown(connection: AsyncConnection) -> psycopg.AsyncConnection[Any]:
    """The test database's tables grown to a cluster's size, then analysed (as autovacuum would have),
    on the test's connection (its rows and statistics rolled back with it)."""
    driver = (await connection.get_raw_connection()).driver_connection
    assert isinstance(driver, psycopg.AsyncConnection)
    for statement in _GROWN:
        await driver.execute(statement)
    await driver.execute("ANALYZE")
    return driver


def _scanned(plan: dict[str, Any]) -> Iterator[str]:
    """The relations a plan (EXPLAIN's JSON) reads by sequential scan."""
    if plan["Node Type"] == "Seq Scan":
        yield plan["Relation Name"]
    for child in plan.get("Plans", []):
        yield from _scanned(child)


def _planned_statements() -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """Each statement of a batch (IngestStatements) and of a budget read, with the parameters of
    several runs (different namespaces and pods, as successive batches and reads have)."""
    runs = range(RUNS)
    pods = [batch_json([{**POD, "pod_uid": f"uid-{n + 1}", "namespace": f"ns-{n + 1}"}]) for n in runs]
    lists = [[f"ns-{n + 1}", f"ns-{n + 900}", f"team-{n}"] for n in runs]

    window = window_parameters(NOW - timedelta(hours=6), NOW)
    return {
        "figures": (pipeline_sql(figures_of(arity(3))), [figures_parameters(NOW, names) for names in lists]),
        # A budget read's (budgets.repository.statuses): one namespace's figures and burn.
        "budget read": (
            pipeline_sql(figures_of(arity(1), burn=True)),
            [{**figures_parameters(NOW, names[:1]), **window} for names in lists],
        ),
        "lock pods": (
            repository._LOCK_PODS,
            [{"pods": p, "now": NOW, "from_sidecar": True} for p in pods],
        ),
        "charge inputs": (
            CHARGE_INPUTS,
            [charge_inputs_parameters(p, names, START, END) for p, names in zip(pods, lists, strict=True)],
        ),
        "weights": (weights(arity(1)), [weights_parameters([f"MODEL-{n}"], START, END) for n in runs]),
        "repeats": (repository._REPEATED, [repository.repeated_parameters(p, (START, END)) for p in pods]),
        "add models": (repository._ADD_MODELS, [{"models": [f"MODEL-{n + 1}"]} for n in runs]),
        "charge": (
            repository._CHARGE,
            [
                {
                    "reports": batch_json([{**REPORT, "pod_uid": f"uid-{n + 2}"}]),
                    "now": NOW + timedelta(seconds=n),
                    "raw_since": NOW + timedelta(seconds=n) - timedelta(hours=1),
                }
                for n in runs
            ],
        ),
        "add used": (
            repository._ADD_USED,
            [
                {
                    "totals": batch_json(
                        [{"namespace": f"ns-{n}", "period_kind": "monthly", "period_start": NOW, "used": "1"}]
                    )
                }
                for n in runs
            ],
        ),
        "add model used": (
            repository._ADD_MODEL_USED,
            [
                {
                    "totals": batch_json(
                        [
                            {
                                "namespace": f"ns-{n}",
                                "period_kind": "monthly",
                                "period_start": NOW,
                                "model": "MODEL-1",
                                "used": "1",
                            }
                        ]
                    )
                }
                for n in runs
            ],
        ),
        "add model burn": (
            repository._ADD_MODEL_BURN,
            [
                {
                    "burn": batch_json(
                        [
                            {
                                "namespace": f"ns-{n}",
                                "model": "MODEL-1",
                                "bucket_start": NOW,
                                "gpu_minutes": "1",
                            }
                        ]
                    )
                }
                for n in runs
            ],
        ),
        "add burn": (
            repository._ADD_BURN,
            [
                {"burn": batch_json([{"namespace": f"ns-{n}", "bucket_start": NOW, "gpu_minutes": "1"}])}
                for n in runs
            ],
        ),
        "lock states": (
            repository.lock_states(arity(3)),
            [array_parameters("namespace", names) for names in lists],
        ),
    }


def _numbered(statement: str) -> tuple[str, list[str]]:
    """The statement with `%(name)s` parameters numbered in order of first appearance (as psycopg sends
    it), and their names in that order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return "%"
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s|%%", number, statement), names


async def kept_plan(
    driver: psycopg.AsyncConnection[Any], statement: str, runs: list[dict[str, Any]]
) -> tuple[int, dict[str, Any]]:
    """Runs the statement prepared by psycopg (as it runs a statement from its fifth run on) once per
    parameters; answers the plans PostgreSQL made for those runs and the plan it keeps for the next."""
    for parameters in runs:
        await driver.execute(statement, parameters, prepare=True)
    text, names = _numbered(statement)
    cursor = await driver.execute(
        "SELECT name, custom_plans FROM pg_prepared_statements WHERE statement = %s", (text,)
    )
    found = await cursor.fetchone()
    assert found is not None, "psycopg prepared it"
    name, custom_plans = found
    values = sql.SQL(", ").join(sql.Literal(runs[-1][key]) for key in names)
    explained = await driver.execute(
        sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE {}({})").format(sql.Identifier(name), values)
    )
    row = await explained.fetchone()
    assert row is not None
    return custom_plans, row[0][0]["Plan"]


async def empty_partitions(driver: psycopg.AsyncConnection[Any]) -> set[str]:
    """The ledger's partitions that hold no row (the days made ahead, the default): a plan may read those
    whole, at no cost, and PostgreSQL re-plans once autovacuum has analysed a partition that filled."""
    cursor = await driver.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'usage_ledger'::regclass"
    )
    empty = set()
    for (name,) in await cursor.fetchall():
        held = await driver.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(sql.Identifier(name)))
        row = await held.fetchone()
        if row is not None and not row[0]:
            empty.add(name)
    return empty


def assert_planned_once_by_index(name: str, custom_plans: int, plan: dict[str, Any], empty: set[str]) -> None:
    """The statement's runs after psycopg prepared it were planned once, and that plan reads no table
    holding rows by sequential scan but those read whole by design."""
    assert custom_plans <= 5, f"{name}: planned anew on every run ({custom_plans} custom plans)"
    scanned = set(_scanned(plan)) - READ_WHOLE - empty
    assert not scanned, f"{name} reads {sorted(scanned)} by sequential scan"


async def test_each_statement_keeps_one_plan_that_finds_rows_by_index(
    grown: psycopg.AsyncConnection[Any],
) -> None:
    """Each statement of an ingest batch and of a budget read, on a large cluster's tables: after the
    five custom plans PostgreSQL always makes first, one kept plan, reading no table whole."""
    failed = []
    empty = await empty_partitions(grown)
    for name, (statement, runs) in _planned_statements().items():
        custom_plans, plan = await kept_plan(grown, statement, runs)
        try:
            assert_planned_once_by_index(name, custom_plans, plan, empty)
        except AssertionError as error:
            failed.append(str(error).splitlines()[0])
    assert not failed, "\n".join(failed)


async def test_a_plan_that_scans_a_grown_table_fails_the_check(grown: psycopg.AsyncConnection[Any]) -> None:
    """The check above catches a regression: without the index its probes use, a budget read scans the
    burn buckets."""
    await grown.execute("ALTER TABLE usage_burn DROP CONSTRAINT pk_usage_burn")
    statement, runs = _planned_statements()["budget read"]
    custom_plans, plan = await kept_plan(grown, statement, runs)
    with pytest.raises(AssertionError, match="usage_burn"):
        assert_planned_once_by_index("budget read", custom_plans, plan, await empty_partitions(grown))


def _relations(plan: dict[str, Any]) -> Iterator[str]:
    """The relations a plan (EXPLAIN's JSON) reads, after the partitions it pruned before running."""
    if "Relation Name" in plan:
        yield plan["Relation Name"]
    for child in plan.get("Plans", []):
        yield from _relations(child)


async def test_the_repeats_check_reads_only_the_partitions_of_its_batch(
    grown: psycopg.AsyncConnection[Any],
) -> None:
    """However many days the ledger keeps, a batch's repeats check locks and reads only the partition its
    span falls in: its reports' values alone (jsonb_to_recordset's) would leave every partition planned."""
    statement, runs = _planned_statements()["repeats"]
    cursor = await grown.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'usage_ledger'::regclass"
    )
    partitions = {name for (name,) in await cursor.fetchall()}
    assert len(partitions) > 2, "the test database's ledger has its day partitions"
    _, plan = await kept_plan(grown, statement, runs)
    assert set(_relations(plan)) & partitions == {"usage_ledger_before"}
