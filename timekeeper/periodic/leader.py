"""Leader election through PostgreSQL: a session-level advisory lock held on a dedicated connection (not
from the pool, with TCP keepalives). When the holder dies the server ends its session and the lock goes
with it; the others try again every few seconds."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import psycopg
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)


def libpq_url(database_url: str) -> str:
    """The SQLAlchemy URL (postgresql+psycopg://) as the plain libpq URL psycopg connects with."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


class LeaderElection:
    """Calls `on_elected` when this process takes the lock and `on_lost` as soon as it may no longer hold
    it (its connection failed a check or broke); runs until cancelled."""

    def __init__(
        self,
        database_url: str,
        lock_key: int,
        retry_seconds: float,
        on_elected: Callable[[], Awaitable[None]],
        on_lost: Callable[[], Awaitable[None]],
        check_seconds: float | None = None,
    ) -> None:
        self.conninfo = libpq_url(database_url)
        self.lock_key = lock_key
        self.retry_seconds = retry_seconds
        # A check slower than this fails it (the leader steps down): by default two retry intervals.
        self.check_seconds = check_seconds if check_seconds is not None else retry_seconds * 2
        # Rounds done (lock attempts or checks, whatever their outcome): what a test waits for instead
        # of sleeping for "a few tries".
        self.rounds = 0
        self.on_elected = on_elected
        self.on_lost = on_lost
        self.leading = False
        # Connecting is given longer than a check: a busy server may take seconds to start a session,
        # and a follower that can never connect in time could never lead.
        self._connect_seconds = max(5, int(retry_seconds * 2))
        self._connection: psycopg.AsyncConnection[tuple[object, ...]] | None = None

    async def _connect(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        # Keepalives and a TCP user timeout so a half-open connection (the server's machine gone) is
        # noticed in seconds rather than after the kernel's two-hour default.
        retry_ms = int(self.retry_seconds * 1000)
        return await psycopg.AsyncConnection.connect(
            self.conninfo,
            autocommit=True,
            connect_timeout=self._connect_seconds,
            keepalives=1,
            keepalives_idle=max(1, int(self.retry_seconds)),
            keepalives_interval=max(1, int(self.retry_seconds)),
            keepalives_count=2,
            tcp_user_timeout=max(1000, retry_ms * 2),
            application_name="gpu-timekeeper-scheduler",
        )

    async def _attempt(self) -> None:
        """One round: connect if needed; a follower tries the lock, the leader checks its connection. Each
        step is limited with asyncio.timeout in this task (3.11's wait_for can lose a cancellation); becoming
        leader is not part of the check's time."""
        if self._connection is None or self._connection.closed:
            async with asyncio.timeout(self._connect_seconds + 1):
                self._connection = await self._connect()
        async with asyncio.timeout(self.check_seconds):
            if self.leading:
                await self._connection.execute("SELECT 1")
                return
            cursor = await self._connection.execute("SELECT pg_try_advisory_lock(%s)", (self.lock_key,))
            row = await cursor.fetchone()
        if row is not None and row[0]:
            self.leading = True
            log.info("scheduler_leader_elected", extra={"lock_key": self.lock_key})
            await self.on_elected()

    async def _give_up(self) -> None:
        was_leading, self.leading = self.leading, False
        connection, self._connection = self._connection, None
        if was_leading:
            log.warning("scheduler_leadership_lost", extra={"lock_key": self.lock_key})
            await self.on_lost()
        if connection is not None:
            await connection.close()

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self._attempt()
                except (psycopg.Error, OSError, TimeoutError) as error:
                    log.warning("scheduler_leader_check_failed", extra={"error": type(error).__name__})
                    await self._give_up()
                self.rounds += 1
                await asyncio.sleep(self.retry_seconds)
        finally:
            # Closing the session releases the lock at once, so a clean shutdown hands over fast.
            await asyncio.shield(self._give_up())
