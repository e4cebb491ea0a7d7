"""The raw ledger's partitions: one per UTC day of interval_end, a range partition from MINVALUE holding what
was there before partitioning, and a DEFAULT one for any row no other partition takes (a late report for a
day already dropped, a day not created yet), so no report ever waits on upkeep."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

log = logging.getLogger(__name__)

PARENT = "usage_ledger"
DEFAULT_PARTITION = "usage_ledger_default"
# DDL on a partition takes ACCESS EXCLUSIVE on the parent (and the default partition) until commit. Upkeep
# and the roll-up ask for it with NOWAIT, again and again for LOCK_PATIENCE seconds, rather than queue for it
# (the queue would stall every report and read behind a long read) or wait inside a deadlock; past it they
# fail, and the next window tries again. Other locks they take are waited for LOCK_TIMEOUT at most.
LOCK_PATIENCE = 5.0
LOCK_TIMEOUT = "5s"
_LOCK_RETRY = 0.02
_LOCK_NOT_AVAILABLE = "55P03"
# Serialises upkeep between replicas (start-up) and the leader's job.
_UPKEEP_LOCK = sa.text("SELECT pg_advisory_xact_lock(hashtext('usage_ledger partitions'))")
# Each partition with its bounds (NULL: MINVALUE, or both NULL: the DEFAULT partition).
_PARTITIONS = sa.text(
    "SELECT c.relname AS name, "
    "CAST(substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \\(''([^'']+)''\\)') AS timestamptz) "
    "AS lower, "
    "CAST(substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \\(''([^'']+)''\\)') AS timestamptz) "
    "AS upper "
    "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
    f"WHERE i.inhparent = CAST('{PARENT}' AS regclass) ORDER BY upper NULLS LAST, name"
)


@dataclass(frozen=True, slots=True)
class Partition:
    name: str
    lower: datetime | None  # None: from MINVALUE (the rows from before partitioning), or the default
    upper: datetime | None  # None: the DEFAULT partition

    @property
    def quoted(self) -> str:
        return quoted(self.name)


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sqlstate(error: DBAPIError) -> str | None:
    return getattr(error.orig, "sqlstate", None)


async def lock_exclusively(session: AsyncSession, names: Sequence[str]) -> None:
    """ACCESS EXCLUSIVE on each table (not its partitions) without ever waiting in the lock queue: NOWAIT,
    retried for LOCK_PATIENCE seconds; then the lock_not_available error is raised."""
    tables = ", ".join(f"ONLY {quoted(name)}" for name in names)
    deadline = time.monotonic() + LOCK_PATIENCE
    while True:
        try:
            async with session.begin_nested():  # a failed try leaves the transaction usable
                await session.execute(sa.text(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE NOWAIT"))
            return
        except DBAPIError as error:
            if _sqlstate(error) != _LOCK_NOT_AVAILABLE or time.monotonic() > deadline:
                raise
        await asyncio.sleep(_LOCK_RETRY)


def day_partition_name(day: date) -> str:
    return f"{PARENT}_p{day:%Y%m%d}"


def midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


async def partitions(session: AsyncSession) -> list[Partition]:
    """The ledger's partitions, by upper bound (the DEFAULT partition last)."""
    result = await session.execute(_PARTITIONS)
    return [Partition(row.name, row.lower, row.upper) for row in result]


async def ensure_days(session: AsyncSession, days: Iterable[date]) -> list[str]:
    """Create the day partitions of `days` that no partition covers yet; answers those created. A day the
    DEFAULT partition already holds rows of is left to it (the roll-up folds those rows by DELETE)."""
    await session.execute(_UPKEEP_LOCK)
    existing = [p for p in await partitions(session) if p.upper is not None]
    missing = [day for day in sorted(set(days)) if not any(_covers(p, day) for p in existing)]
    if not missing:
        return []
    await lock_exclusively(session, [PARENT, DEFAULT_PARTITION])
    created = []
    for day in missing:
        start, end, name = midnight(day), midnight(day + timedelta(days=1)), day_partition_name(day)
        try:
            async with session.begin_nested():
                await session.execute(
                    sa.text(
                        f"CREATE TABLE {quoted(name)} PARTITION OF {PARENT} "
                        f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
                    )
                )
        except DBAPIError as error:  # rows of that day in the default partition (a check violation)
            if _sqlstate(error) != "23514":
                raise
            log.warning("ledger_partition_left_to_default", extra={"day": day.isoformat()})
            continue
        created.append(name)
    return created


def _covers(partition: Partition, day: date) -> bool:
    """Whether the (range) partition overlaps the UTC day."""
    start, end = midnight(day), midnight(day + timedelta(days=1))
    lower_ok = partition.lower is None or partition.lower < end
    return lower_ok and partition.upper is not None and start < partition.upper


def days_ahead(now: datetime, ahead: int) -> list[date]:
    """Today (UTC) and the `ahead` days after it."""
    today = now.astimezone(UTC).date()
    return [today + timedelta(days=n) for n in range(ahead + 1)]
