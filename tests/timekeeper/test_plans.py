"""How PostgreSQL plans the ingest statements: index probes whatever a table's size, and plans made once.

psycopg prepares a statement after five runs and PostgreSQL keeps the generic plan it then makes, so a plan
made on young tables stays as they grow (until an ANALYZE, never where autovacuum is off), and a statement
whose generic plan looks dearer than a custom one is planned again on every run (docs/performance.md,
"Plans"). Both cost the ingest batch and the budget read server CPU on every run; these tests pin them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import TextClause
from sqlalchemy.ext.asyncio import AsyncConnection

from timekeeper.db.driver import PLANNING_SQL
from timekeeper.store.billing.repository import (
    CHARGE_INPUTS,
    WEIGHTS,
    charge_inputs_parameters,
    weights_parameters,
)
from timekeeper.store.budgets.burn import burned_query
from timekeeper.store.budgets.repository import figures_parameters, statuses_on
from timekeeper.store.usage import repository
from timekeeper.store.usage.repository import batch_json

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
    "gpu_count": 1,
    "mean_sm_util_pct": 50.0,
    "max_mem_used_bytes": 1,
    "gpus": [],
    "peak_sm_util_pct": 50.0,
    "mem_used_bytes": 1,
    "mean_power_w": None,
    "gpu_status_bits": 0,
    "covers": True,
}
NAMESPACES = ["team-a", "team-b"]
# Tables read whole by design, small whatever the cluster's size: the default budget (one row) and the
# pools (an admin's few, each selector matched against a namespace's labels).
READ_WHOLE = {"default_budget", "budget_pools"}


async def _driver(connection: AsyncConnection) -> psycopg.AsyncConnection[Any]:
    driver = (await connection.get_raw_connection()).driver_connection
    assert isinstance(driver, psycopg.AsyncConnection)
    return driver


def _scanned(plan: dict[str, Any]) -> Iterator[str]:
    """The relations a plan (EXPLAIN's JSON) reads by sequential scan."""
    if plan["Node Type"] == "Seq Scan":
        yield plan["Relation Name"]
    for child in plan.get("Plans", []):
        yield from _scanned(child)


def _planned_statements() -> dict[str, tuple[str, dict[str, Any]]]:
    pods = batch_json([POD])
    return {
        "figures": (repository._FIGURES, figures_parameters(NOW, NAMESPACES)),
        "lock pods": (repository._LOCK_PODS, {"pods": pods, "now": NOW, "from_sidecar": True}),
        "charge inputs": (CHARGE_INPUTS, charge_inputs_parameters(pods, NAMESPACES, START, END)),
        "weights": (WEIGHTS, weights_parameters(["NVIDIA-H100"], START, END)),
        "repeats": (repository._REPEATED, {"pods": pods}),
        "charge": (repository._CHARGE, {"reports": batch_json([REPORT]), "now": NOW}),
        "add used": (
            repository._ADD_USED,
            {
                "totals": batch_json(
                    [{"namespace": "team-a", "period_kind": "monthly", "period_start": NOW, "used": "1"}]
                )
            },
        ),
        "add burn": (
            repository._ADD_BURN,
            {"burn": batch_json([{"namespace": "team-a", "bucket_start": NOW, "gpu_minutes": "1"}])},
        ),
        "lock states": (repository._LOCK_STATES, {"namespaces": NAMESPACES}),
        # A budget read's (budgets.repository.statuses_on), beside the figures above.
        "burned": _compiled(*burned_query(NOW - timedelta(hours=6), NOW, NAMESPACES)),
    }


def _compiled(statement: TextClause, parameters: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return str(statement.compile(dialect=repository.psycopg_dialect())), parameters


async def test_planned_statements_read_no_table_by_sequential_scan(connection: AsyncConnection) -> None:
    """On the near-empty tables of a fresh install (where a sequential scan is cheapest, and the plan then
    kept), each statement of a batch and of a budget read finds its rows by index."""
    driver = await _driver(connection)
    await driver.execute(PLANNING_SQL, prepare=False)
    for name, (statement, parameters) in _planned_statements().items():
        cursor = await driver.execute(f"EXPLAIN (FORMAT JSON) {statement}", parameters)
        row = await cursor.fetchone()
        assert row is not None
        scanned = set(_scanned(row[0][0]["Plan"])) - READ_WHOLE
        assert not scanned, f"{name} reads {sorted(scanned)} by sequential scan"


async def test_a_batch_plans_its_transaction_for_index_probes(connection: AsyncConnection) -> None:
    """The batch's read says so to the planner for its transaction (the plans above are the batch's)."""
    driver = await _driver(connection)
    await driver.execute("SET LOCAL enable_seqscan = on")
    await driver.execute("SET LOCAL plan_cache_mode = auto")
    statements = repository.IngestStatements(driver)
    read = await statements.read(batch_json([POD]), ["team-a"], (START, END), NOW, from_sidecar=True)
    assert read.uncovered == {"uid-1": [(START, END)]}
    cursor = await driver.execute(
        "SELECT current_setting('enable_seqscan'), current_setting('plan_cache_mode')"
    )
    assert await cursor.fetchone() == ("off", "force_generic_plan")


async def test_a_budget_read_plans_its_statements_for_index_probes(connection: AsyncConnection) -> None:
    """A budget read's figures and burn (one pipeline: one implicit transaction in autocommit) are
    planned as the batch's."""
    await connection.exec_driver_sql("SET LOCAL enable_seqscan = on")
    driver = await _driver(connection)
    figures, burned = await statuses_on(driver, NOW, NOW - timedelta(hours=6), ["team-a"])
    assert [f.namespace for f in figures] == ["team-a"] and burned == {}
    cursor = await (await _driver(connection)).execute("SELECT current_setting('enable_seqscan')")
    assert await cursor.fetchone() == ("off",)


async def test_figures_of_listed_namespaces_keep_one_plan_by_index(connection: AsyncConnection) -> None:
    """The figures of listed namespaces (every ingest batch's) are planned once and that plan is kept,
    with many namespaces known, and the kept plan finds them by index."""
    driver = await _driver(connection)
    await driver.execute(
        "INSERT INTO namespace_status (namespace, state) SELECT 'known-' || i, 'in_budget' "
        "FROM generate_series(1, 5000) AS i"
    )
    await driver.execute("ANALYZE namespace_status")
    await driver.execute(PLANNING_SQL, prepare=False)
    for run in range(12):
        names = [f"known-{run}", f"team-{run}"]
        await driver.execute(repository._FIGURES, figures_parameters(NOW, names), prepare=True)
    cursor = await driver.execute(
        "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
        ("%WITH wanted AS (SELECT DISTINCT unnest%",),
    )
    found = await cursor.fetchone()
    assert found is not None, "the statement was prepared"
    name, generic, custom = found
    assert custom == 0 and generic == 12, f"{custom} custom plans, {generic} runs of the kept one"
    # Its parameters in the order they first appear: the namespaces, then each period kind's start.
    starts = figures_parameters(NOW)
    values = [["known-1"], starts["daily"], starts["weekly"], starts["monthly"], starts["none"]]
    explained = await driver.execute(
        sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE {}({})").format(
            sql.Identifier(name), sql.SQL(", ").join(sql.Literal(value) for value in values)
        )
    )
    row = await explained.fetchone()
    assert row is not None
    assert not set(_scanned(row[0][0]["Plan"])) - READ_WHOLE
