"""SQL for the periodic jobs: claiming a job's window, closing out silent pods, folding old ledger rows
into hourly aggregates."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

# A second claim of the same window conflicts: at once when the first is committed, after waiting on the
# first's row lock when it is not (and it goes ahead if the first rolled back).
_CLAIM = sa.text(
    "INSERT INTO job_runs (job, window_start, ran_at, replica, detail) "
    "VALUES (:job, :window_start, :now, :replica, '{}') ON CONFLICT DO NOTHING RETURNING job"
)
_RECORD = sa.text(
    "UPDATE job_runs SET detail = CAST(:detail AS jsonb) WHERE job = :job AND window_start = :window_start"
)
# A pod counts as running until it sent its final report or was closed out after its last report.
RUNNING_POD_SQL = "NOT final AND (closed_at IS NULL OR closed_at <= last_report_at)"
_CLOSE_OUT = sa.text(
    f"UPDATE pod_coverage SET closed_at = :now WHERE {RUNNING_POD_SQL} AND last_report_at < :silent_since "
    "RETURNING namespace, pod, pod_uid"
)
_RUNNING = sa.text(f"SELECT count(*) FROM pod_coverage WHERE {RUNNING_POD_SQL}")
# Ledger rows that ended before the cutoff are deleted and their charged time, split at hour boundaries,
# is added to the (pod, hour, share) aggregate, in one statement: exactly the deleted rows are folded.
# A row counts once in each hour its charged time touches (as the usage query's hour grouping does).
_ROLL_UP = sa.text(
    """
    WITH folded AS (
        DELETE FROM usage_ledger WHERE interval_end <= :cutoff
        RETURNING id, namespace, pod, pod_uid, gpu_share, charged, mean_sm_util_pct
    ), pieces AS (
        SELECT f.id, f.namespace, f.pod, f.pod_uid, f.gpu_share, f.mean_sm_util_pct, b AS hour_start,
               r * tstzrange(b, b + interval '1 hour') AS piece
        FROM folded f
        CROSS JOIN LATERAL unnest(f.charged) AS r
        CROSS JOIN LATERAL generate_series(
            date_trunc('hour', lower(r), 'UTC'), upper(r) - interval '1 microsecond', interval '1 hour') AS b
    ), per_report AS (
        SELECT pod_uid, hour_start, gpu_share, id, max(namespace) AS namespace, max(pod) AS pod,
               range_agg(piece) AS charged, max(mean_sm_util_pct) AS util
        FROM pieces GROUP BY pod_uid, hour_start, gpu_share, id
    ), upserted AS (
        INSERT INTO usage_hourly
            (namespace, pod, pod_uid, hour_start, gpu_share, charged, reports, util_sum, util_count)
        SELECT max(namespace), max(pod), pod_uid, hour_start, gpu_share, range_agg(charged), count(*),
               sum(util), count(util)
        FROM per_report GROUP BY pod_uid, hour_start, gpu_share
        ON CONFLICT ON CONSTRAINT uq_usage_hourly_pod_hour_share DO UPDATE SET
            charged = usage_hourly.charged + excluded.charged,
            reports = usage_hourly.reports + excluded.reports,
            util_sum = CASE WHEN excluded.util_sum IS NULL THEN usage_hourly.util_sum
                            ELSE coalesce(usage_hourly.util_sum, 0) + excluded.util_sum END,
            util_count = usage_hourly.util_count + excluded.util_count
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM folded) AS folded, (SELECT count(*) FROM upserted) AS hours
    """
)


class SchedulerRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def claim(self, job: str, window_start: datetime, now: datetime, replica: str) -> bool:
        """Record the job's run for the window; False when the window already ran (nothing to do)."""
        result = await self.session.execute(
            _CLAIM, {"job": job, "window_start": window_start, "now": now, "replica": replica}
        )
        return result.first() is not None

    async def record(self, job: str, window_start: datetime, detail: dict[str, Any]) -> None:
        await self.session.execute(
            _RECORD, {"job": job, "window_start": window_start, "detail": json.dumps(detail)}
        )

    async def lock_states(self) -> None:
        """Lock every namespace's stored state (in name order) before recomputing them: a report charging
        meanwhile then writes its state after ours, and one that committed first is in the totals we read
        next. Without it, a sweep could overwrite a fresher state with one computed from older totals."""
        await self.session.execute(
            sa.text("SELECT namespace FROM namespace_status ORDER BY namespace FOR UPDATE")
        )

    async def close_out(self, now: datetime, silent_since: datetime) -> list[tuple[str, str, str]]:
        """Close the pods that are running but sent nothing since `silent_since`."""
        result = await self.session.execute(_CLOSE_OUT, {"now": now, "silent_since": silent_since})
        return [(row.namespace, row.pod, row.pod_uid) for row in result]

    async def running_pods(self) -> int:
        return int((await self.session.execute(_RUNNING)).scalar_one())

    async def roll_up(self, cutoff: datetime) -> tuple[int, int]:
        """(ledger rows folded, hourly rows written) for the rows that ended by the cutoff."""
        row = (await self.session.execute(_ROLL_UP, {"cutoff": cutoff})).one()
        return int(row.folded), int(row.hours)
