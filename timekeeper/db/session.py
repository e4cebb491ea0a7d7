"""Engine construction, the request-scoped session and `transaction`: the one place that commits or rolls
back (requests and the report batcher both go through it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Annotated, Any

import psycopg
import sqlalchemy as sa
from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from timekeeper.db.embedded import embedded_database_url
from timekeeper.settings import Settings


async def resolve_database_url(settings: Settings) -> str:
    if settings.database_url:
        return settings.database_url
    return await asyncio.to_thread(embedded_database_url, settings.data_dir)


def build_engine(url: str, pool_size: int = 10) -> AsyncEngine:
    """Sessions run in UTC so day and hour buckets never depend on the server's time zone. A pooled
    connection the server has closed is replaced at checkout (`_still_connected`)."""
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        # JIT off: its compile time (tens of ms, seconds for a big plan) lands on short queries whose
        # estimated cost passes jit_above_cost, e.g. the forecast's burn on every read (docs/performance.md).
        connect_args={"options": "-c timezone=UTC -c jit=off"},
    )
    sa.event.listen(engine.sync_engine.pool, "checkout", _still_connected)
    return engine


def _still_connected(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """What the pool's pre-ping checked, without its round trip (one per budget read; docs/performance.md,
    "Reads"): a connection the server closed (`closed_by_server`) makes the pool drop it and hand out a
    fresh one, as the pre-ping did; a server that is unreachable answers that connect with the outage."""
    if closed_by_server(dbapi_connection.driver_connection):
        raise sa.exc.DisconnectionError("the server closed the connection")


def closed_by_server(connection: psycopg.AsyncConnection[Any]) -> bool:
    """Whether the server has gone away (restart, crash, idle timeout, terminated backend) from an idle
    connection, without a round trip: it has closed the socket, so reading what is there without waiting
    (libpq's socket never blocks) finds the end of it. Not seen here, as not by a pre-ping that would
    wait on it: a peer that vanished without closing (a partition), which the statement then meets."""
    pgconn = connection.pgconn
    try:
        # Twice: a backend that was stopped sends its FATAL message before closing, and the first read
        # takes that message, the second the end of the stream. On a live idle connection both find
        # nothing to read and return at once.
        pgconn.consume_input()
        pgconn.consume_input()
    except psycopg.OperationalError:
        return True
    return pgconn.status != psycopg.pq.ConnStatus.OK


def build_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def build_read_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions for requests that only read, on the same pool in autocommit: a read is its statements
    alone, without the BEGIN and COMMIT round trips a transaction would add. Each statement sees its
    own snapshot, so a read that needs one consistent view is one statement (the budget reads are)."""
    return async_sessionmaker(engine.execution_options(isolation_level="AUTOCOMMIT"), expire_on_commit=False)


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


class HeldConnection:
    """One connection kept from transaction to transaction (each ingest batch runner has one): a batch
    then costs no pool checkout, check and return (docs/performance.md, "A connection held by each batch
    runner"). Checked without a round trip before each transaction as the pool checks at checkout
    (`closed_by_server`), so a restart or a terminated backend between batches costs no batch; dropped
    after any error (the next transaction connects afresh, or meets the outage and says so) and when the
    sessionmaker's engine changes. A sessionmaker bound to a connection (the tests' per-test
    transaction) is used as it is."""

    def __init__(self) -> None:
        self._engine: AsyncEngine | None = None
        self._connection: AsyncConnection | None = None
        self._driver: psycopg.AsyncConnection[Any] | None = None

    @asynccontextmanager
    async def transaction(self, sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
        """`transaction(sessions)`, on the held connection when `sessions` is bound to an engine."""
        engine = sessions.kw.get("bind")
        if not isinstance(engine, AsyncEngine):
            async with transaction(sessions) as session:
                yield session
            return
        connection = await self._connection_to(engine)
        try:
            async with transaction(lambda: sessions(bind=connection)) as session:
                yield session
        except BaseException:
            await self.release(invalidate=True)
            raise

    async def _connection_to(self, engine: AsyncEngine) -> AsyncConnection:
        if self._engine is not engine:
            await self.release()
        elif self._driver is not None and closed_by_server(self._driver):
            await self.release(invalidate=True)
        if self._connection is None:
            connection = await engine.connect()
            driver = (await connection.get_raw_connection()).driver_connection
            assert isinstance(driver, psycopg.AsyncConnection), "the engine's driver is psycopg"
            self._engine, self._connection, self._driver = engine, connection, driver
        return self._connection

    async def release(self, *, invalidate: bool = False) -> None:
        """Gives the connection back to its pool (closed, when `invalidate`: it may be broken)."""
        connection = self._connection
        self._engine = self._connection = self._driver = None
        if connection is None:
            return
        if invalidate:
            with suppress(Exception):
                await connection.invalidate()
        with suppress(Exception):  # a pool already disposed of, a server already gone: nothing to give back
            await connection.close()


async def _session(request: Request) -> AsyncIterator[AsyncSession]:
    async with transaction(request.app.state.sessionmaker) as session:
        yield session


# scope="function": the commit happens when the endpoint returns, before the answer is sent, so an
# acknowledged report is a committed one.
SessionDep = Annotated[AsyncSession, Depends(_session, scope="function")]
