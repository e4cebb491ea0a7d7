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

from timekeeper.db.driver import session_driver
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

    @asynccontextmanager
    async def reading(self, sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[Reading]:
        """A read on the held connection when `sessions` is bound to an engine (which must be in
        autocommit: statements run on the driver, outside any transaction the session would end); else
        on a session of `sessions` as it is. Dropped after any error, as after a failed transaction: a
        read cancelled or failed mid-statement leaves the connection in a state not worth finding out."""
        engine = sessions.kw.get("bind")
        if not isinstance(engine, AsyncEngine):
            async with sessions() as session:
                yield SessionReading(session)
            return
        connection = await self._connection_to(engine)
        assert self._driver is not None
        if not self._driver.autocommit:
            await self.release()
            raise ValueError("reads on a held connection need an autocommit sessionmaker")
        reading = HeldReading(self._driver, lambda: sessions(bind=connection))
        try:
            yield reading
            await reading.aclose()
        except BaseException:
            with suppress(Exception):
                await reading.aclose()
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


class Reading:
    """What a read runs on: a psycopg connection for the statements it runs on the driver
    (timekeeper.db.driver) and, for a read that needs the ORM as well, a session on that connection."""

    async def driver(self) -> psycopg.AsyncConnection[Any]:
        raise NotImplementedError

    async def session(self) -> AsyncSession:
        raise NotImplementedError


class SessionReading(Reading):
    """A read on a session: its own connection (the tests' per-test transaction; a request's session)."""

    def __init__(self, session: AsyncSession) -> None:
        self._session = session

    async def driver(self) -> psycopg.AsyncConnection[Any]:
        return await session_driver(self._session)

    async def session(self) -> AsyncSession:
        return self._session


class HeldReading(Reading):
    """A read on a held connection in autocommit: its psycopg connection as it is, and a session bound to
    it made only when asked (a budget read of a namespace outside any pool needs none; making and closing
    one costs ~160 Python calls, ~50 µs)."""

    def __init__(self, driver: psycopg.AsyncConnection[Any], sessions: Callable[[], AsyncSession]) -> None:
        self._driver = driver
        self._sessions = sessions
        self._session: AsyncSession | None = None

    async def driver(self) -> psycopg.AsyncConnection[Any]:
        return self._driver

    async def session(self) -> AsyncSession:
        if self._session is None:
            self._session = self._sessions()
        return self._session

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


class ReadConnections:
    """Held connections for the budget reads (docs/performance.md, "Reads, fourth pass"): a read takes
    an idle one (no pool checkout, autocommit set and reset, return: ~200 µs of CPU a read) and gives it
    back after, so reads at once never share one; a read that finds none idle gets a new one. Up to `keep`
    stay held between reads (more would sit out of the engine's pool unused), the rest go back to the
    pool. Each is checked before use and dropped after an error as `HeldConnection` does."""

    def __init__(self, keep: int = 2) -> None:
        self._keep = keep
        self._idle: list[HeldConnection] = []

    @asynccontextmanager
    async def reading(self, sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[Reading]:
        """`HeldConnection.reading` on a connection no other read holds meanwhile."""
        held = self._idle.pop() if self._idle else HeldConnection()
        try:
            async with held.reading(sessions) as reading:
                yield reading
        finally:
            if len(self._idle) < self._keep:
                self._idle.append(held)
            else:
                await held.release()

    async def release(self) -> None:
        """Gives every idle held connection back to its pool (at shutdown, before the engine goes)."""
        idle, self._idle = self._idle, []
        for held in idle:
            await held.release()


async def _session(request: Request) -> AsyncIterator[AsyncSession]:
    async with transaction(request.app.state.sessionmaker) as session:
        yield session


# scope="function": the commit happens when the endpoint returns, before the answer is sent, so an
# acknowledged report is a committed one.
SessionDep = Annotated[AsyncSession, Depends(_session, scope="function")]
