"""SQL for the periodic jobs: claiming a job's window, closing out silent pods, folding old ledger rows
into hourly aggregates. Core statements on the models; the roll-up stays one PostgreSQL statement (its
multirange arithmetic has no Core spelling)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
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

__all__ = ["RUNNING_POD", "PeriodicRepository"]
# Ledger rows are folded, their charged time split at hour boundaries and added to the (pod, hour, share,
# charge share, model) aggregate, in one statement: exactly the rows `folded` answers (those it deletes from
# the default or pre-partitioning partition, or a whole day partition the caller then drops).
# A row counts once in each hour its charged time touches (as the usage query's hour grouping does); its
# measurements are added as value x its seconds in the hour (domain/measurements.py), so they fold exactly.
_FOLDED_COLUMNS = (
    "id, namespace, pod, pod_uid, gpu_share, charge_share, gpu_model, charged, "
    "mean_sm_util_pct, peak_sm_util_pct, mem_used_bytes, mean_power_w, gpu_status_bits"
)
_ROLL_UP = """
    WITH folded AS ({folded}), pieces AS (
        SELECT f.*, b AS hour_start, r * tstzrange(b, b + interval '1 hour') AS piece
        FROM folded f
        CROSS JOIN LATERAL unnest(f.charged) AS r
        CROSS JOIN LATERAL generate_series(
            date_trunc('hour', lower(r), 'UTC'), upper(r) - interval '1 microsecond', interval '1 hour') AS b
    ), per_report AS (
        SELECT pod_uid, hour_start, gpu_share, charge_share, gpu_model, id, max(namespace) AS namespace,
               max(pod) AS pod, range_agg(piece) AS charged,
               sum(extract(epoch FROM upper(piece) - lower(piece))) AS seconds,
               max(mean_sm_util_pct) AS util, max(coalesce(peak_sm_util_pct, mean_sm_util_pct)) AS util_peak,
               max(mem_used_bytes) AS mem, max(mean_power_w) AS power, max(gpu_status_bits) AS status_bits
        FROM pieces GROUP BY pod_uid, hour_start, gpu_share, charge_share, gpu_model, id
    ), upserted AS (
        INSERT INTO usage_hourly
            (namespace, pod, pod_uid, hour_start, gpu_share, charge_share, gpu_model, charged, reports,
             util_seconds, util_covered_seconds, peak_sm_util_pct, mem_byte_seconds, mem_covered_seconds,
             peak_mem_used_bytes, energy_joules, gpu_status_bits)
        SELECT max(namespace), max(pod), pod_uid, hour_start, gpu_share, charge_share, gpu_model,
               range_agg(charged), count(*),
               sum(util * seconds), coalesce(sum(seconds) FILTER (WHERE util IS NOT NULL), 0), max(util_peak),
               sum(mem * seconds), coalesce(sum(seconds) FILTER (WHERE mem IS NOT NULL), 0), max(mem),
               sum(power * seconds), bit_or(status_bits)
        FROM per_report GROUP BY pod_uid, hour_start, gpu_share, charge_share, gpu_model
        ON CONFLICT ON CONSTRAINT uq_usage_hourly_pod_hour_share DO UPDATE SET
            charged = usage_hourly.charged + excluded.charged,
            reports = usage_hourly.reports + excluded.reports,
            util_seconds = coalesce(usage_hourly.util_seconds + excluded.util_seconds,
                                    usage_hourly.util_seconds, excluded.util_seconds),
            util_covered_seconds = usage_hourly.util_covered_seconds + excluded.util_covered_seconds,
            peak_sm_util_pct = greatest(usage_hourly.peak_sm_util_pct, excluded.peak_sm_util_pct),
            mem_byte_seconds = coalesce(usage_hourly.mem_byte_seconds + excluded.mem_byte_seconds,
                                        usage_hourly.mem_byte_seconds, excluded.mem_byte_seconds),
            mem_covered_seconds = usage_hourly.mem_covered_seconds + excluded.mem_covered_seconds,
            peak_mem_used_bytes = greatest(usage_hourly.peak_mem_used_bytes, excluded.peak_mem_used_bytes),
            energy_joules = coalesce(usage_hourly.energy_joules + excluded.energy_joules,
                                     usage_hourly.energy_joules, excluded.energy_joules),
            gpu_status_bits = usage_hourly.gpu_status_bits | excluded.gpu_status_bits
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM folded) AS folded, (SELECT count(*) FROM upserted) AS hours
    """


def _fold(folded: str) -> sa.TextClause:
    return sa.text(_ROLL_UP.format(folded=folded))


@dataclass(frozen=True, slots=True)
class RolledUp:
    folded: int  # ledger rows folded
    hours: int  # hourly rows written
    dropped: list[str]  # day partitions folded whole and dropped


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

    async def roll_up(self, cutoff: datetime) -> RolledUp:
        """Fold the ledger rows that ended by the cutoff: a partition wholly before it is folded whole and
        dropped (no dead rows, nothing to vacuum); the default and pre-partitioning partitions' rows by
        DELETE. A day partition still partly after the cutoff waits for a later window."""
        await self.session.execute(sa.text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
        found = await partitions(self.session)
        whole = [p for p in found if p.upper is not None and p.upper <= cutoff]
        deleting = [p for p in found if p.lower is None and p not in whole]
        folded = hours = 0
        for partition in deleting:
            statement = _fold(
                f"DELETE FROM ONLY {partition.quoted} WHERE interval_end <= :cutoff "
                f"RETURNING {_FOLDED_COLUMNS}"
            )
            row = (await self.session.execute(statement, {"cutoff": cutoff})).one()
            folded, hours = folded + int(row.folded), hours + int(row.hours)
        for partition in whole:
            # SHARE until the drop: a late report for that day waits, holding the parent's lock, so the
            # drop cannot happen under it (lock_exclusively retries, or gives up and the report goes in).
            await self.session.execute(sa.text(f"LOCK TABLE ONLY {partition.quoted} IN SHARE MODE"))
            statement = _fold(f"SELECT {_FOLDED_COLUMNS} FROM ONLY {partition.quoted}")
            row = (await self.session.execute(statement)).one()
            folded, hours = folded + int(row.folded), hours + int(row.hours)
        if whole:
            # ACCESS EXCLUSIVE on the parent, the default partition and the days until the commit just after.
            await lock_exclusively(self.session, [PARENT, DEFAULT_PARTITION, *(p.name for p in whole)])
            for partition in whole:
                await self.session.execute(sa.text(f"DROP TABLE {partition.quoted}"))
        return RolledUp(folded, hours, [p.name for p in whole])
