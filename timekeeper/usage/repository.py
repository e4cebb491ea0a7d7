"""SQL for the usage ledger: the ingest statements (each only reads or writes; what to charge is the
ingest service's plan) and the usage queries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.budgets.models import UsageTotal
from timekeeper.usage.figures import FigureSums
from timekeeper.usage.models import PodCoverage
from timekeeper.usage.planning import Interval, TotalKey

# A batch holds at most one report per pod (ON CONFLICT may touch a row once per statement), as one JSON
# array of rows in pod_uid order: every writer locks pods, then totals, then namespace states, then the
# snapshot version, each in key order, so concurrent batches (and replicas) never deadlock. Multiranges
# and jsonb_to_recordset keep these statements as text.
_REPORTS = (
    "jsonb_to_recordset(CAST(:reports AS jsonb)) AS r(pod_uid text, namespace text, pod text, seq bigint, "
    "interval_start timestamptz, interval_end timestamptz, final boolean, gpu_share numeric, "
    "gpu_minutes numeric, gpu_count integer, mean_sm_util_pct double precision, max_mem_used_bytes bigint, "
    "gpus jsonb, peak_sm_util_pct double precision, mem_used_bytes bigint, mean_power_w numeric, "
    "gpu_status_bits smallint)"
)
# Creates each pod's row on its first report and locks it; answers the part of each interval not yet
# charged. A pod_uid already known in another namespace is neither touched nor answered. `last_report_at`
# records a sign of life from the sidecar: a charge made without one (the reconciler's, for silent time)
# leaves it alone, and a pod first seen that way counts as silent since the start of that charge.
_LOCK_PODS = sa.text(
    f"WITH r AS (SELECT * FROM {_REPORTS}), locked AS ("
    "INSERT INTO pod_coverage (pod_uid, namespace, pod, covered, last_seq, last_report_at, final) "
    "SELECT pod_uid, namespace, pod, '{}', seq, "
    "CASE WHEN :from_sidecar THEN CAST(:now AS timestamptz) ELSE interval_start END, false "
    "FROM r ORDER BY pod_uid "
    "ON CONFLICT (pod_uid) DO UPDATE SET last_report_at = CASE WHEN :from_sidecar "
    "THEN excluded.last_report_at ELSE pod_coverage.last_report_at END "
    "WHERE pod_coverage.namespace = excluded.namespace RETURNING pod_uid, covered) "
    "SELECT r.pod_uid, tstzmultirange(tstzrange(r.interval_start, r.interval_end)) - locked.covered "
    "AS uncovered FROM r JOIN locked USING (pod_uid)"
)
# Answers the reports that were new; a repeat of (pod_uid, seq, interval) inserts nothing.
_INSERT_LEDGER = sa.text(
    "INSERT INTO usage_ledger (namespace, pod, pod_uid, seq, interval_start, interval_end, gpu_share, "
    "charged, gpu_minutes, final, received_at, gpu_count, mean_sm_util_pct, max_mem_used_bytes, gpus, "
    "peak_sm_util_pct, mem_used_bytes, mean_power_w, gpu_status_bits) "
    "SELECT r.namespace, r.pod, r.pod_uid, r.seq, r.interval_start, r.interval_end, r.gpu_share, "
    "tstzmultirange(tstzrange(r.interval_start, r.interval_end)) - c.covered, r.gpu_minutes, r.final, "
    "CAST(:now AS timestamptz), r.gpu_count, r.mean_sm_util_pct, r.max_mem_used_bytes, r.gpus, "
    "r.peak_sm_util_pct, r.mem_used_bytes, r.mean_power_w, r.gpu_status_bits "
    f"FROM {_REPORTS} JOIN pod_coverage c USING (pod_uid) "
    "ON CONFLICT ON CONSTRAINT uq_usage_ledger_report DO NOTHING RETURNING pod_uid"
)
_COVER = sa.text(
    "UPDATE pod_coverage p SET covered = p.covered + tstzmultirange(tstzrange(r.interval_start, "
    "r.interval_end)), last_seq = r.seq, pod = r.pod, final = p.final OR r.final "
    f"FROM {_REPORTS} WHERE p.pod_uid = r.pod_uid"
)
# Raw ledger rows and the hourly per-pod aggregates the roll-up job folds old rows into, in one shape:
# a report counts once per aggregate (an aggregate row counts the reports folded into its hour). Each
# additive figure is a value for `per` seconds of the source's charged time: a ledger row's per second
# (its utilisation, memory, power; 1 where it has the figure), an aggregate's for its whole charged time
# (its sums), so the seconds of a bucket or window take their part (all of it for a whole hour, exactly).
_USAGE_SOURCE = (
    "SELECT 'l' || l.id AS id, l.pod, l.gpu_share, l.charged, 1 AS reports, 1 AS per, "
    "l.mean_sm_util_pct AS util, CAST(l.mean_sm_util_pct IS NOT NULL AS int) AS util_covered, "
    "coalesce(l.peak_sm_util_pct, l.mean_sm_util_pct) AS util_peak, l.mem_used_bytes AS mem, "
    "CAST(l.mem_used_bytes IS NOT NULL AS int) AS mem_covered, l.mem_used_bytes AS mem_peak, "
    "l.mean_power_w AS energy, l.gpu_status_bits AS status_bits "
    "FROM usage_ledger l "
    "WHERE l.namespace = :namespace AND l.interval_end > :since AND l.interval_start < :until "
    "UNION ALL SELECT 'h' || h.id, h.pod, h.gpu_share, h.charged, h.reports, "
    "(SELECT sum(extract(epoch FROM upper(c) - lower(c))) FROM unnest(h.charged) AS c), "
    "h.util_seconds, h.util_covered_seconds, h.peak_sm_util_pct, h.mem_byte_seconds, h.mem_covered_seconds, "
    "h.peak_mem_used_bytes, h.energy_joules, h.gpu_status_bits "
    "FROM usage_hourly h WHERE h.namespace = :namespace "
    "AND h.hour_start > CAST(:since AS timestamptz) - interval '1 hour' AND h.hour_start < :until"
)

GroupBy = Literal["pod", "hour", "day"]
_USAGE_PIECE = {
    "pod": ("s.pod", "r", ""),
    "hour": (
        'to_char(b, \'YYYY-MM-DD"T"HH24:00:00"Z"\')',
        "r * tstzrange(b, b + interval '1 hour')",
        "CROSS JOIN LATERAL generate_series(date_trunc('hour', lower(r), 'UTC'), "
        "upper(r) - interval '1 microsecond', interval '1 hour') AS b",
    ),
    "day": (
        "to_char(b, 'YYYY-MM-DD')",
        "r * tstzrange(b, b + interval '1 day')",
        "CROSS JOIN LATERAL generate_series(date_trunc('day', lower(r), 'UTC'), "
        "upper(r) - interval '1 microsecond', interval '1 day') AS b",
    ),
}


def batch_json(rows: Sequence[Mapping[str, Any]]) -> str:
    """A batch's rows (the columns of _REPORTS) as the one JSON parameter its statements read with
    jsonb_to_recordset: encoded in C, rather than a Python-dumped array per column."""
    return orjson.dumps(rows).decode()


class UsageRepository:
    """The ledger's statements. Each takes the batch's rows (in pod_uid order, at most one per pod)
    already encoded by batch_json, and only reads or writes: what to charge is decided by the caller."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def lock_pods(self, rows: str, now: datetime, *, from_sidecar: bool) -> dict[str, list[Interval]]:
        """Creates and locks each pod's coverage row; answers, for the pods of this namespace, the part of
        their interval not yet charged (a pod_uid known in another namespace is absent from the answer)."""
        locked = await self.session.execute(
            _LOCK_PODS, {"reports": rows, "now": now, "from_sidecar": from_sidecar}
        )
        return {row.pod_uid: [(piece.lower, piece.upper) for piece in row.uncovered] for row in locked}

    async def owners(self, pod_uids: Sequence[str]) -> dict[str, str]:
        """The namespace each pod_uid reports for."""
        result = await self.session.execute(
            sa.select(PodCoverage.pod_uid, PodCoverage.namespace).where(PodCoverage.pod_uid.in_(pod_uids))
        )
        return dict(result.tuples().all())

    async def insert_ledger(self, rows: str, now: datetime) -> set[str]:
        """Adds the reports' ledger rows (each charged the part of its interval its pod has not covered);
        answers the pod_uids whose report was new (a repeat of (pod_uid, seq, interval) adds nothing)."""
        inserted = await self.session.execute(_INSERT_LEDGER, {"reports": rows, "now": now})
        return set(inserted.scalars())

    async def cover(self, rows: str) -> None:
        """Adds the reports' intervals to their pods' charged time."""
        await self.session.execute(_COVER, {"reports": rows})

    async def add_used(self, added: Mapping[TotalKey, Decimal]) -> list[tuple[TotalKey, Decimal, Decimal]]:
        """Adds to the running totals (in the given order, the lock order); answers each total's
        (used, granted) afterwards."""
        if not added:
            return []
        statement = insert(UsageTotal).values(
            [
                {"namespace": ns, "period_kind": kind, "period_start": start, "used_gpu_minutes": amount}
                for (ns, kind, start), amount in added.items()
            ]
        )
        result = await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[UsageTotal.namespace, UsageTotal.period_kind, UsageTotal.period_start],
                set_={"used_gpu_minutes": UsageTotal.used_gpu_minutes + statement.excluded.used_gpu_minutes},
            ).returning(
                UsageTotal.namespace,
                UsageTotal.period_kind,
                UsageTotal.period_start,
                UsageTotal.used_gpu_minutes,
                UsageTotal.granted_gpu_minutes,
            )
        )
        return [
            (
                (row.namespace, row.period_kind, row.period_start),
                row.used_gpu_minutes,
                row.granted_gpu_minutes,
            )
            for row in result
        ]

    async def usage(
        self, namespace: str, since: datetime, until: datetime, group_by: GroupBy
    ) -> list[tuple[str, Decimal, int, FigureSums]]:
        """Charged GPU-minutes inside [since, until), exactly (charged time clipped to the window and to
        each bucket, share x seconds summed exactly and rounded once per row), grouped by pod, hour or day,
        with the figures' sums over the same seconds. Raw ledger rows and the hourly aggregates old rows
        were folded into answer alike."""
        key, piece, bucket = _USAGE_PIECE[group_by]
        query = sa.text(
            f"WITH source AS ({_USAGE_SOURCE}), per_source AS ("
            f"SELECT {key} AS key, s.id, "
            f"sum(s.gpu_share * extract(epoch FROM upper({piece}) - lower({piece}))) AS share_seconds, "
            f"sum(extract(epoch FROM upper({piece}) - lower({piece}))) AS seconds, max(s.per) AS per, "
            "max(s.reports) AS reports, max(s.util) AS util, max(s.util_covered) AS util_covered, "
            "max(s.util_peak) AS util_peak, max(s.mem) AS mem, max(s.mem_covered) AS mem_covered, "
            "max(s.mem_peak) AS mem_peak, max(s.energy) AS energy, max(s.status_bits) AS status_bits "
            "FROM source s "
            "CROSS JOIN LATERAL unnest(s.charged * tstzmultirange(tstzrange(:since, :until))) AS r "
            f"{bucket} GROUP BY 1, 2) "
            "SELECT key, round(sum(share_seconds) / 60, 9) AS minutes, sum(reports) AS reports, "
            "sum(util * seconds / per) AS util_seconds, "
            "coalesce(sum(util_covered * seconds / per), 0) AS util_covered_seconds, "
            "max(util_peak) AS util_peak, sum(mem * seconds / per) AS mem_byte_seconds, "
            "coalesce(sum(mem_covered * seconds / per), 0) AS mem_covered_seconds, "
            "max(mem_peak) AS mem_peak, sum(energy * seconds / per) AS energy_joules, "
            "bit_or(status_bits) AS status_bits FROM per_source GROUP BY key ORDER BY key"
        )
        result = await self.session.execute(query, {"namespace": namespace, "since": since, "until": until})
        return [
            (
                row.key,
                row.minutes,
                int(row.reports),
                FigureSums(
                    util_seconds=row.util_seconds,
                    util_covered_seconds=row.util_covered_seconds,
                    peak_sm_util_pct=row.util_peak,
                    mem_byte_seconds=row.mem_byte_seconds,
                    mem_covered_seconds=row.mem_covered_seconds,
                    peak_mem_used_bytes=None if row.mem_peak is None else int(row.mem_peak),
                    energy_joules=row.energy_joules,
                    gpu_status_bits=int(row.status_bits),
                ),
            )
            for row in result
        ]
