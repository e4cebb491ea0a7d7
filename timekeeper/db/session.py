"""Engine construction, the request's sessions and `transaction`: the one place that commits or rolls
back (requests and the report batcher both go through it). A route gets a write session with
`SessionDep` and reads with `ReadsDep` (autocommit, retried once on a closed connection), both from the
context (timekeeper/context.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, TypeVar

import sqlalchemy as sa
from fastapi import Depends
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from timekeeper.context import ContextDep
from timekeeper.db.embedded import embedded_database_url
from timekeeper.settings import Settings


async def resolve_database_url(settings: Settings) -> str:
    if settings.database_url:
        return settings.database_url
    return await asyncio.to_thread(embedded_database_url, settings.data_dir)


T = TypeVar("T")

# A pooled connection older than this is replaced at its checkout, before a proxy's or the server's idle
# timeout (idle_session_timeout) is likely to have closed it under the pool.
POOL_RECYCLE_SECONDS = 1800


def build_engine(
    url: str, pool_size: int = 10, max_overflow: int | None = None, options: str = ""
) -> AsyncEngine:
    """Sessions run in UTC so day and hour buckets never depend on the server's time zone. Checkouts are
    not pinged: a connection found closed in use invalidates every older one in the pool (SQLAlchemy's
    disconnect handling), and reads and ingest batches meeting it run once more (`read`, usage.batcher)."""
    return create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size if max_overflow is None else max_overflow,
        pool_recycle=POOL_RECYCLE_SECONDS,
        # JIT off: its compile time (tens of ms, seconds for a big plan) lands on short queries whose
        # estimated cost passes jit_above_cost, e.g. the forecast's burn on every read (docs/performance.md).
        connect_args={"options": f"-c timezone=UTC -c jit=off {options}".rstrip()},
    )


def build_export_engine(url: str, settings: Settings) -> AsyncEngine:
    """The chargeback exports' own pool, of one connection per export at once: an export never holds a
    connection the requests need. Read-only; a statement, or a transaction left idle by a reader that
    stopped reading (its snapshot holds back vacuum of ingest's tables), ends at the export timeout."""
    timeout_ms = max(1, round(settings.chargeback_export_timeout_seconds * 1000))
    return build_engine(
        url,
        settings.chargeback_exports,
        max_overflow=0,
        options=f"-c statement_timeout={timeout_ms} -c idle_in_transaction_session_timeout={timeout_ms} "
        "-c default_transaction_read_only=on",
    )


def build_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def build_read_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions for requests that only read, on the same pool in autocommit: a read is its statements
    alone, without the BEGIN and COMMIT round trips a transaction would add. Each statement sees its
    own snapshot, so a read that needs one consistent view is one statement (the budget reads are)."""
    return async_sessionmaker(engine.execution_options(isolation_level="AUTOCOMMIT"), expire_on_commit=False)


async def read(sessions: Callable[[], AsyncSession], work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """Runs `work`, a read, in a session of `sessions`; one that met a pooled connection the server had
    closed (a restart, a terminated backend) runs once more, on a connection made since."""
    try:
        async with sessions() as session:
            return await work(session)
    except sa.exc.DBAPIError as error:
        if not error.connection_invalidated:
            raise
    async with sessions() as session:
        return await work(session)


@asynccontextmanager
async def transaction(sessions: Callable[[], AsyncSession]) -> AsyncIterator[AsyncSession]:
    """A session whose work is committed when the block ends, rolled back when it raises."""
    async with sessions() as session:
        try:
            yield session
        except BaseException:
            await session.rollback()
            raise
        await session.commit()


class Reads:
    """Runs reads in sessions of one sessionmaker, each through `read` (its retry included)."""

    __slots__ = ("sessions",)

    def __init__(self, sessions: Callable[[], AsyncSession]) -> None:
        self.sessions = sessions

    async def __call__(self, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
        return await read(self.sessions, work)


async def _session(context: ContextDep) -> AsyncIterator[AsyncSession]:
    async with transaction(context.sessions) as session:
        yield session


async def _reads(context: ContextDep) -> Reads:
    return Reads(context.reads)


# scope="function": the commit happens when the endpoint returns, before the answer is sent, so an
# acknowledged report is a committed one.
SessionDep = Annotated[AsyncSession, Depends(_session, scope="function")]
# Reads in autocommit, without a transaction's BEGIN and COMMIT (build_read_sessionmaker).
ReadsDep = Annotated[Reads, Depends(_reads)]
