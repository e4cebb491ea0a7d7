"""psycopg's pipeline mode on a session's own connection: the one place the timekeeper sends SQL beside
SQLAlchemy, for ingest alone. A batch's statements travel together, one round trip to read and one to
write whatever their number, in the session's transaction; through SQLAlchemy each statement is a round
trip of its own, with more CPU per batch (measured by bench/ingest_pipeline.py).

A batch's transaction is begun by its first pipeline. psycopg begins one itself before a statement on a
connection outside autocommit, and in pipeline mode it sends that BEGIN with a Sync of its own and waits
for it: a round trip that carries nothing else (docs/performance.md, "What a report costs"). So a session
that will check a connection out of its engine's pool and has begun nothing on it yet gets that connection in
SQLAlchemy's AUTOCOMMIT isolation level, where psycopg begins nothing, and the caller's first pipeline sends
BEGIN ahead of its statements. (A session joined to a caller's connection, as the tests' are, goes on in
the caller's transaction.) The session's
commit and rollback end that transaction as any other: psycopg's commit() and rollback() act on the
transaction the server has open, whatever the autocommit setting; SQLAlchemy restores the connection's
isolation level when it goes back to the pool."""

from __future__ import annotations

from functools import cache
from typing import Any, cast

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

_PSYCOPG = psycopg_dialect()  # type: ignore[no-untyped-call]


_AUTOCOMMIT = {"isolation_level": "AUTOCOMMIT"}
# What a batch's first pipeline sends first on a connection pipeline_connection found with nothing begun.
BEGIN = "BEGIN"


async def pipeline_connection(session: AsyncSession) -> tuple[psycopg.AsyncConnection[Any], bool]:
    """The session's own psycopg connection, and whether the caller's first pipeline must begin the
    session's transaction (send BEGIN first): so for a session on an engine that has begun none yet, whose
    connection is checked out in AUTOCOMMIT for it; a session already in a transaction, or joined to a
    connection's, goes on in it."""
    begin = isinstance(session.bind, AsyncEngine) and not session.in_transaction()
    connection = await session.connection(execution_options=_AUTOCOMMIT if begin else None)
    driver = cast(psycopg.AsyncConnection[Any], (await connection.get_raw_connection()).driver_connection)
    return driver, begin


@cache
def pipeline_sql(statement: sa.TextClause) -> str:
    """A text statement in psycopg's parameter style (`:name` → `%(name)s`, `%` escaped)."""
    return str(statement.compile(dialect=_PSYCOPG))
