"""SQL for the periodic jobs: claiming a job's window, closing out silent pods, removing the raw ledger
rows past their window (their charge is in the hourly aggregates already), folding old pod-hours into
pod-days."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.budgets.states.models import NamespaceStatus
from timekeeper.db.locks import by_namespace
from timekeeper.periodic.models import JobRun
from timekeeper.usage.models import RUNNING_POD, PodCoverage
from timekeeper.usage.partitions import (
    DEFAULT_PARTITION,
    LOCK_TIMEOUT,
    PARENT,
    lock_exclusively,
    partitions,
)
from timekeeper.usage.repository import FOLD_HOUR

__all__ = ["RUNNING_POD", "PeriodicRepository"]
_HOUR = timedelta(hours=1)
# How far before its cutoff the roll-up deletes a day partition's raw rows, hour by hour.
LOOK_BACK = timedelta(hours=6)


@dataclass(frozen=True, slots=True)
class Folded:
    hours: int  # distinct hours of pod-hours folded into their days
    rows: int  # pod-hour rows folded


# The oldest hour of pod-hours after :after and before :before: one probe of ix_usage_pod_hours_hour_start.
_NEXT_HOUR = sa.text(
    "SELECT min(hour_start) FROM usage_pod_hours WHERE hour_start > :after AND hour_start < :before"
)


@dataclass(frozen=True, slots=True)
class Pruned:
    deleted: int  # raw ledger rows deleted
    dropped: list[str]  # day partitions past the window, dropped whole


class PeriodicRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def claim(self, job: str, window_start: datetime, now: datetime, replica: str) -> bool:
        """Record the job's run for the window; False when the window already ran. A second claim of the same
        window conflicts: at once after the first commits, after waiting on its row lock before (and goes
        ahead if the first rolled back)."""
        claimed = await self.session.execute(
            insert(JobRun)
            .values(job=job, window_start=window_start, ran_at=now, replica=replica, detail={})
            .on_conflict_do_nothing()
            .returning(JobRun.job)
        )
        return claimed.first() is not None

    async def release(self, job: str, window_start: datetime) -> None:
        """Give a claimed window back (its work failed): another execution may claim it."""
        await self.session.execute(
            sa.delete(JobRun)
            .where(JobRun.job == job, JobRun.window_start == window_start)
            .execution_options(synchronize_session=False)
        )

    async def record(self, job: str, window_start: datetime, detail: dict[str, Any]) -> None:
        await self.session.execute(
            sa.update(JobRun)
            .where(JobRun.job == job, JobRun.window_start == window_start)
            .values(detail=detail)
            .execution_options(synchronize_session=False)
        )

    async def lock_states(self) -> None:
        """Lock every namespace's stored state (in name order) before recomputing them: a report charging
        meanwhile then writes its state after ours, and one that committed first is in the totals we read
        next. Without it, a sweep could overwrite a fresher state with one computed from older totals."""
        await self.session.execute(
            sa.select(NamespaceStatus.namespace)
            .order_by(by_namespace(NamespaceStatus.namespace))
            .with_for_update()
        )

    async def close_out(self, now: datetime, silent_since: datetime) -> list[tuple[str, str, str]]:
        """Close the pods that are running but sent nothing since `silent_since`."""
        result = await self.session.execute(
            sa.update(PodCoverage)
            .where(RUNNING_POD, PodCoverage.last_report_at < silent_since)
            .values(closed_at=now)
            .returning(PodCoverage.namespace, PodCoverage.pod, PodCoverage.pod_uid)
            .execution_options(synchronize_session=False)
        )
        return [(row.namespace, row.pod, row.pod_uid) for row in result]

    async def running_pods(self) -> int:
        count = await self.session.scalar(
            sa.select(sa.func.count()).select_from(PodCoverage).where(RUNNING_POD)
        )
        return int(count or 0)

    async def next_hour(self, after: datetime, before: datetime) -> datetime | None:
        """The oldest hour of pod-hours after `after` and before `before` (None: none left)."""
        return cast(
            datetime | None, await self.session.scalar(_NEXT_HOUR, {"after": after, "before": before})
        )

    async def fold_hour(self, hour: datetime) -> int:
        """Fold the hour's pod-hours into their days (FOLD_HOUR, one statement); answers the rows moved."""
        result = await self.session.execute(sa.text(FOLD_HOUR), {"hour": hour})
        return cast(CursorResult[Any], result).rowcount

    async def prune_ledger(self, cutoff: datetime) -> Pruned:
        """Remove the raw ledger rows that ended by the cutoff (their charge is in the hourly aggregates
        since ingest): a day partition wholly before it is dropped (no dead rows, nothing to vacuum); the
        rows of the partition the cutoff falls in (those of the LOOK_BACK before it), the default and the
        pre-partitioning one by DELETE, an hour of interval_end per statement, so no statement grows
        with the day."""
        await self.session.execute(sa.text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
        found = await partitions(self.session)
        whole = [p for p in found if p.upper is not None and p.upper <= cutoff]
        deleting = [p for p in found if p not in whole and (p.lower is None or p.lower < cutoff)]
        deleted = 0
        for partition in deleting:
            # A day's rows older than the look-back were deleted by earlier windows (a raw row is only
            # written while it ends inside the window); any a long outage of the job left go with the day.
            since = None if partition.lower is None else max(partition.lower, cutoff - LOOK_BACK)
            if since is None:  # the default or pre-partitioning partition: from its oldest row
                since = await self.session.scalar(
                    sa.text(f"SELECT min(interval_end) FROM ONLY {partition.quoted}")
                )
                if since is None:
                    continue
            hour = since.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
            while hour < cutoff:
                result = await self.session.execute(
                    sa.text(
                        f"DELETE FROM ONLY {partition.quoted} "
                        "WHERE interval_end >= :hour AND interval_end < :next AND interval_end <= :cutoff"
                    ),
                    {"hour": hour, "next": hour + _HOUR, "cutoff": cutoff},
                )
                deleted += cast(CursorResult[Any], result).rowcount
                hour += _HOUR
        if whole:
            # ACCESS EXCLUSIVE on the parent, the default partition and the days until the commit just after.
            await lock_exclusively(self.session, [PARENT, DEFAULT_PARTITION, *(p.name for p in whole)])
            for partition in whole:
                await self.session.execute(sa.text(f"DROP TABLE {partition.quoted}"))
        return Pruned(deleted, [p.name for p in whole])
