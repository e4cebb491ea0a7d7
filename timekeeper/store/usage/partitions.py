"""The raw ledger's partitions: one per UTC day of interval_end, a range partition from MINVALUE holding what
was there before partitioning, and a DEFAULT one for any row no other partition takes (a late report for a
day already dropped, a day not created yet), so no report ever waits on upkeep."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

log = logging.getLogger(__name__)

PARENT = "usage_ledger"
DEFAULT_PARTITION = "usage_ledger_default"
# Upkeep and roll-up wait this long at most for the parent's lock (DDL on a partition takes ACCESS EXCLUSIVE
# on the parent until commit); past it they fail, and the next window tries again, rather than stall ingest.
LOCK_TIMEOUT = "5s"
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
        return '"' + self.name.replace('"', '""') + '"'


def day_partition_name(day: date) -> str:
    return f"{PARENT}_p{day:%Y%m%d}"


def midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


async def partitions(session: AsyncSession) -> list[Partition]:
    """The ledger's partitions, by upper bound (the DEFAULT partition last)."""
    result = await session.execute(_PARTITIONS)
    return [Partition(row.name, row.lower, row.upper) for row in result]


async def ensure_days(session: AsyncSession, days: Iterable[date]) -> list[str]:
    """Create the day partitions of `days` that no partition covers yet; answers those created. A day the
    DEFAULT partition already holds rows of is left to it (the roll-up folds those rows by DELETE)."""
    await session.execute(_UPKEEP_LOCK)
    existing = [p for p in await partitions(session) if p.upper is not None]
    created = []
    for day in sorted(set(days)):
        start, end = midnight(day), midnight(day + timedelta(days=1))
        if any(
            (p.lower is None or p.lower < end) and p.upper is not None and start < p.upper for p in existing
        ):
            continue
        name = day_partition_name(day)
        try:
            async with session.begin_nested():
                await session.execute(sa.text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
                await session.execute(
                    sa.text(
                        f'CREATE TABLE "{name}" PARTITION OF {PARENT} '
                        f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
                    )
                )
        except DBAPIError as error:  # rows of that day in the default partition (a check violation)
            if getattr(error.orig, "sqlstate", None) != "23514":
                raise
            log.warning("ledger_partition_left_to_default", extra={"day": day.isoformat()})
            continue
        created.append(name)
    return created


def days_ahead(now: datetime, ahead: int) -> list[date]:
    """Today (UTC) and the `ahead` days after it."""
    today = now.astimezone(UTC).date()
    return [today + timedelta(days=n) for n in range(ahead + 1)]
