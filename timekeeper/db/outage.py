"""An outage (the server unreachable or gone) told apart from a statement the database refused; each
outage logged once when it begins and ends and shown as metrics, its requests answered 503 with
Retry-After; a connection lost in use makes the pool replace its older ones (timekeeper.db.session)."""

from __future__ import annotations

import logging
import time

import psycopg
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger(__name__)

# How long a client is asked to wait before retrying (sidecars keep their reports buffered meanwhile).
RETRY_AFTER_SECONDS = 5
# SQLSTATEs of a server going away or not yet accepting connections.
_GONE = ("57P01", "57P02", "57P03")


def is_outage(error: BaseException) -> bool:
    """Whether the error is the database being unreachable rather than a statement it refused: no
    connection (refused, reset, timed out, terminated by an administrator), or the pool exhausted."""
    cause: BaseException | None = error
    if isinstance(error, sa.exc.DBAPIError):
        if error.connection_invalidated:
            return True
        cause = error.orig
    if isinstance(cause, psycopg.InterfaceError | OSError | sa.exc.TimeoutError | TimeoutError):
        return True
    if isinstance(cause, psycopg.OperationalError):
        sqlstate = cause.sqlstate
        return sqlstate is None or sqlstate.startswith("08") or sqlstate in _GONE
    return False


class OutageWatch:
    """Watches an engine: the first connection error of an outage is logged, as is the first connection
    made after it; `timekeeper_database_up` and `timekeeper_database_errors_total` show it meanwhile."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.down_since: float | None = None
        self.up = Gauge("timekeeper_database_up", "0 while the database does not answer", registry=registry)
        self.up.set(1)
        self.errors = Counter(
            "timekeeper_database_errors", "Connection-level database errors (outages)", registry=registry
        )

    def attach(self, engine: AsyncEngine) -> None:
        sa.event.listen(engine.sync_engine, "handle_error", self._on_error)
        sa.event.listen(engine.sync_engine.pool, "connect", self._on_connect)

    def _on_error(self, context: ExceptionContext) -> None:
        if context.is_disconnect or is_outage(context.original_exception):
            self.errors.inc()
            if self.down_since is None:
                self.down_since = time.monotonic()
                self.up.set(0)
                log.error("database_unavailable", extra={"error": repr(context.original_exception)})

    def _on_connect(self, *_: object) -> None:
        if self.down_since is not None:
            log.warning(
                "database_recovered", extra={"outage_seconds": round(time.monotonic() - self.down_since, 3)}
            )
            self.down_since = None
            self.up.set(1)
