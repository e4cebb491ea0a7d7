"""Statements run on the session's own psycopg connection, for the reads where SQLAlchemy's per-statement
and per-row work is most of the cost (docs/performance.md, "Reads"): a budget status (about as much CPU
in SQLAlchemy's execute as in psycopg and the round trip together) and the admission snapshot (10,000
rows). Same connection, same transaction (or autocommit) as the session's; errors are raised as
SQLAlchemy's, so an outage is still told from a refused statement (timekeeper/db/outage.py)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any, cast

import psycopg
import sqlalchemy as sa
from psycopg.rows import AsyncRowFactory, namedtuple_row
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncSession

# The statements of an ingest batch and of a budget read find their rows by index (a probe per report, pod,
# total or namespace), whatever a table's size, with one plan kept per statement; their transaction (a
# pipeline's implicit one, for a read) says both to the planner. psycopg prepares a statement after five
# runs and PostgreSQL keeps the generic plan it then makes: made while a table was young, where reading
# its page or two was cheapest, a sequential scan stayed in the plan as the table grew, until an ANALYZE
# invalidated it (autovacuum's, a minute or more later; never where autovacuum is off): the coverage
# update read every pod and the figures every total, each batch. And the figures of listed namespaces were
# planned again on every run (~500-650 µs of server CPU): their plan for any list estimates 100
# namespaces, the list's own plan its length, so PostgreSQL judged the kept plan dearer. Checked in
# tests/timekeeper/test_plans.py; docs/performance.md, "Plans".
PLANNING_SQL = (
    "SELECT set_config('enable_seqscan', 'off', true) AS seqscan, "
    "set_config('plan_cache_mode', 'force_generic_plan', true) AS plans"
)
PLANNING = sa.text(PLANNING_SQL)


@cache
def _compiled(statement: sa.TextClause, dialect: Dialect) -> str:
    """The statement in the driver's parameter style (`:name` → `%(name)s`, `%` escaped)."""
    return str(statement.compile(dialect=dialect))


async def driver_rows(
    session: AsyncSession,
    statement: sa.TextClause,
    params: Mapping[str, Any],
    row_factory: AsyncRowFactory[Any] = namedtuple_row,
) -> list[Any]:
    """The statement's rows as psycopg's named tuples (no SQLAlchemy Row, no result metadata), or as
    `row_factory` makes them (`tuple_row` for many rows: a named tuple costs a Python call per row)."""
    connection = await session.connection()
    driver = cast(psycopg.AsyncConnection[Any], (await connection.get_raw_connection()).driver_connection)
    sql = _compiled(statement, connection.dialect)
    try:
        async with driver.cursor(row_factory=row_factory) as cursor:
            await cursor.execute(sql, params)
            return await cursor.fetchall()
    except psycopg.Error as error:
        raise sa.exc.DBAPIError.instance(sql, dict(params), error, psycopg.Error) from error


async def session_driver(session: AsyncSession) -> psycopg.AsyncConnection[Any]:
    """The session's own psycopg connection (in the session's transaction, or autocommit)."""
    connection = await session.connection()
    return cast(psycopg.AsyncConnection[Any], (await connection.get_raw_connection()).driver_connection)


# Compiling a text statement only turns its `:name` parameters into the driver's style, the same for
# every engine on psycopg; so statements run on a bare psycopg connection compile without an engine.
_PSYCOPG = psycopg_dialect()


async def driver_rows_pipelined(
    driver: psycopg.AsyncConnection[Any], *queries: tuple[sa.TextClause, Mapping[str, Any]]
) -> list[list[Any]]:
    """Each statement's rows as psycopg's named tuples, as driver_rows, all sent in one pipeline on
    `driver` (a session's own connection, `session_driver`, or a held read connection's): one round trip
    however many statements. Each stays its own statement, so PostgreSQL keeps a generic plan for each
    where it would re-plan a statement made of both (docs/performance.md, "Reads")."""
    compiled = [(_compiled(statement, _PSYCOPG), params) for statement, params in queries]
    try:
        # The block's exit sends the one Sync and reads every result into its cursor; a sync() inside it
        # would be a round trip of its own before the exit's (docs/performance.md, "One sync per pipeline").
        async with driver.pipeline():
            cursors = []
            for sql, params in compiled:
                cursor = driver.cursor(row_factory=namedtuple_row)
                await cursor.execute(sql, params)
                cursors.append(cursor)
        return [await cursor.fetchall() for cursor in cursors]
    except psycopg.Error as error:
        statements = "; ".join(sql for sql, _ in compiled)
        raise sa.exc.DBAPIError.instance(statements, {}, error, psycopg.Error) from error
