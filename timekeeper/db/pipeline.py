"""psycopg's pipeline mode on a session's own connection: the one place the timekeeper sends SQL beside
SQLAlchemy, for ingest alone. A batch's statements travel together, one round trip to read and one to
write whatever their number, in the session's transaction; through SQLAlchemy each statement is a round
trip of its own, with more CPU per batch (measured by bench/ingest_pipeline.py)."""

from __future__ import annotations

from functools import cache
from typing import Any, cast

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.ext.asyncio import AsyncSession

_PSYCOPG = psycopg_dialect()  # type: ignore[no-untyped-call]


async def pipeline_connection(session: AsyncSession) -> psycopg.AsyncConnection[Any]:
    """The session's own psycopg connection, in the session's transaction."""
    connection = await session.connection()
    return cast(psycopg.AsyncConnection[Any], (await connection.get_raw_connection()).driver_connection)


@cache
def pipeline_sql(statement: sa.TextClause) -> str:
    """A text statement in psycopg's parameter style (`:name` → `%(name)s`, `%` escaped)."""
    return str(statement.compile(dialect=_PSYCOPG))
