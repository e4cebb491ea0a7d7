"""SQL for the usage ledger: the report ingest path (one function, core SQL) and the usage queries."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.wire import BudgetState
from timekeeper.admission.repository import AdmissionRepository
from timekeeper.budgets.periods import Period, PeriodKind, budget_state, period_containing
from timekeeper.budgets.repository import BudgetRepository, NamespaceFigures
from timekeeper.errors import TimekeeperError
from timekeeper.usage.charging import split_charge
from timekeeper.usage.schemas import ReportIn

# A batch holds at most one report per pod (ON CONFLICT may touch a row once per statement). Each array is
# one column of the batch, in pod_uid order: every writer locks pods, then totals, then namespace states,
# then the snapshot version, each in key order, so concurrent batches (and replicas) never deadlock.
_REPORTS = (
    "jsonb_to_recordset(CAST(:reports AS jsonb)) AS r(pod_uid text, namespace text, pod text, seq bigint, "
    "interval_start timestamptz, interval_end timestamptz, final boolean, gpu_share numeric, "
    "gpu_minutes numeric, gpu_count integer, mean_sm_util_pct double precision, max_mem_used_bytes bigint, "
    "gpus jsonb)"
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
_OWNERS = sa.text(
    "SELECT pod_uid, namespace FROM pod_coverage WHERE pod_uid = ANY(CAST(:pod_uids AS text[]))"
)
# Answers the reports that were new; a repeat of (pod_uid, seq, interval) inserts nothing.
_INSERT_LEDGER = sa.text(
    "INSERT INTO usage_ledger (namespace, pod, pod_uid, seq, interval_start, interval_end, gpu_share, "
    "charged, gpu_minutes, final, received_at, gpu_count, mean_sm_util_pct, max_mem_used_bytes, gpus) "
    "SELECT r.namespace, r.pod, r.pod_uid, r.seq, r.interval_start, r.interval_end, r.gpu_share, "
    "tstzmultirange(tstzrange(r.interval_start, r.interval_end)) - c.covered, r.gpu_minutes, r.final, "
    "CAST(:now AS timestamptz), r.gpu_count, r.mean_sm_util_pct, r.max_mem_used_bytes, r.gpus "
    f"FROM {_REPORTS} JOIN pod_coverage c USING (pod_uid) "
    "ON CONFLICT ON CONSTRAINT uq_usage_ledger_report DO NOTHING RETURNING pod_uid"
)
_COVER = sa.text(
    "UPDATE pod_coverage p SET covered = p.covered + tstzmultirange(tstzrange(r.interval_start, "
    "r.interval_end)), last_seq = r.seq, pod = r.pod, final = p.final OR r.final "
    f"FROM {_REPORTS} WHERE p.pod_uid = r.pod_uid"
)
_ADD_USED = sa.text(
    "INSERT INTO usage_totals (namespace, period_kind, period_start, used_gpu_minutes) "
    "SELECT * FROM unnest(CAST(:namespaces AS text[]), CAST(:kinds AS text[]), "
    "CAST(:starts AS timestamptz[]), CAST(:amounts AS numeric[])) ORDER BY 1, 2, 3 "
    "ON CONFLICT (namespace, period_kind, period_start) "
    "DO UPDATE SET used_gpu_minutes = usage_totals.used_gpu_minutes + excluded.used_gpu_minutes "
    "RETURNING namespace, period_kind, period_start, used_gpu_minutes, granted_gpu_minutes"
)

# Raw ledger rows and the hourly per-pod aggregates the roll-up job folds old rows into, in one shape:
# a report counts once per aggregate (an aggregate row counts the reports folded into its hour).
_USAGE_SOURCE = (
    "SELECT 'l' || l.id AS id, l.pod, l.gpu_share, l.charged, 1 AS reports, "
    "l.mean_sm_util_pct AS util_sum, CAST(l.mean_sm_util_pct IS NOT NULL AS int) AS util_count "
    "FROM usage_ledger l "
    "WHERE l.namespace = :namespace AND l.interval_end > :since AND l.interval_start < :until "
    "UNION ALL SELECT 'h' || h.id, h.pod, h.gpu_share, h.charged, h.reports, h.util_sum, h.util_count "
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


def _row(report: ReportIn) -> dict[str, Any]:
    """A report as the batch statements read it (jsonb_to_recordset); amounts as exact decimal text."""
    gpu_count, mean_util, max_memory = report.measured()
    return {
        "pod_uid": report.pod_uid,
        "namespace": report.namespace,
        "pod": report.pod,
        "seq": report.seq,
        "interval_start": report.interval_start,
        "interval_end": report.interval_end,
        "final": report.final,
        "gpu_share": str(report.gpu_share),
        "gpu_minutes": None,
        "gpu_count": gpu_count,
        "mean_sm_util_pct": mean_util,
        "max_mem_used_bytes": max_memory,
        "gpus": [gpu.model_dump() for gpu in report.gpus],
    }


def _batch(rows: dict[str, dict[str, Any]], reports: Sequence[ReportIn]) -> str:
    """These reports' rows as one JSON parameter: encoded in C, rather than a Python-dumped array per
    column. The rows are built once per batch and shared by its statements."""
    return orjson.dumps([rows[report.pod_uid] for report in reports]).decode()


@dataclass(frozen=True, slots=True)
class IngestOutcome:
    duplicate: bool
    gpu_minutes: Decimal
    state: BudgetState
    state_changed: bool = False


class UsageRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def ingest(self, report: ReportIn, now: datetime, *, from_sidecar: bool = True) -> IngestOutcome:
        """Charge one report in this transaction (a batch of one); raises what refused it. A charge that
        is no sign of life from the pod's sidecar (`from_sidecar=False`) leaves its last report time."""
        [outcome] = await self.ingest_batch([report], now, from_sidecar=from_sidecar)
        if isinstance(outcome, TimekeeperError):
            raise outcome
        return outcome

    async def ingest_batch(
        self, reports: Sequence[ReportIn], now: datetime, *, from_sidecar: bool = True
    ) -> list[IngestOutcome | TimekeeperError]:
        """Charge a batch of reports, at most one per pod, in this transaction: for each, the uncovered part
        of its interval, split at period boundaries, with its ledger row, its pod's coverage, the running
        totals and its namespace's state. Set-based: the same few statements whatever the batch's size.
        Answers in the reports' order; a report refused (its pod_uid belongs to another namespace) gets
        its error and changes nothing."""
        session = self.session
        in_order = sorted(reports, key=lambda report: report.pod_uid)
        names = sorted({report.namespace for report in in_order})
        figures = {f.namespace: f for f in await BudgetRepository(session).figures(now, names)}
        rows = {report.pod_uid: _row(report) for report in in_order}
        locked = await session.execute(
            _LOCK_PODS, {"reports": _batch(rows, in_order), "now": now, "from_sidecar": from_sidecar}
        )
        uncovered = {row.pod_uid: [(piece.lower, piece.upper) for piece in row.uncovered] for row in locked}
        outcomes: dict[str, IngestOutcome | TimekeeperError] = {}
        refused = [report.pod_uid for report in in_order if report.pod_uid not in uncovered]
        if refused:
            for pod_uid, owner in await session.execute(_OWNERS, {"pod_uids": refused}):
                outcomes[pod_uid] = TimekeeperError(f"pod_uid {pod_uid} reports for namespace {owner}", 409)
        accepted = [report for report in in_order if report.pod_uid in uncovered]
        charges = {
            report.pod_uid: split_charge(
                report.gpu_share, uncovered[report.pod_uid], figures[report.namespace].config.period
            )
            for report in accepted
        }
        charged = {pod_uid: sum((amount for _, amount in c), Decimal(0)) for pod_uid, c in charges.items()}
        new: set[str] = set()
        if accepted:
            for pod_uid, amount in charged.items():
                rows[pod_uid]["gpu_minutes"] = str(amount)
            inserted = await session.execute(_INSERT_LEDGER, {"reports": _batch(rows, accepted), "now": now})
            new = set(inserted.scalars())
        fresh = [report for report in accepted if report.pod_uid in new]
        covering = [report for report in fresh if uncovered[report.pod_uid]]
        if covering:
            await session.execute(_COVER, {"reports": _batch(rows, covering)})
        current = {ns: (f.used_gpu_minutes, f.granted_gpu_minutes) for ns, f in figures.items()}
        current.update(await self._add_used(fresh, charges, figures, now))
        states: dict[str, BudgetState] = {}
        for namespace in sorted({report.namespace for report in fresh}):
            config = figures[namespace].config
            used, granted = current[namespace]
            states[namespace] = budget_state(
                config.budget_gpu_minutes, granted, used, config.warn_at_fraction
            )
        admission = AdmissionRepository(session)
        changed = await admission.set_states(states)
        if changed:
            await admission.bump_version()
        repeated = sorted(
            {report.namespace for report in accepted if report.pod_uid not in new} - set(states)
        )
        stored = await admission.stored_states(repeated)
        for report in accepted:
            if report.pod_uid in new:
                outcomes[report.pod_uid] = IngestOutcome(
                    False, charged[report.pod_uid], states[report.namespace]
                )
            else:
                state = stored.get(report.namespace) or "in_budget"
                outcomes[report.pod_uid] = IngestOutcome(True, Decimal(0), state)
        return [outcomes[report.pod_uid] for report in reports]

    async def _add_used(
        self,
        fresh: list[ReportIn],
        charges: dict[str, list[tuple[Period, Decimal]]],
        figures: dict[str, NamespaceFigures],
        now: datetime,
    ) -> dict[str, tuple[Decimal, Decimal]]:
        """Add the batch's charges to the running totals, one row per (namespace, period) in key order;
        answers the namespaces' (used, granted) of their current period where the batch charged it."""
        added: dict[tuple[str, datetime], Decimal] = defaultdict(Decimal)
        for report in fresh:
            for period, amount in charges[report.pod_uid]:
                added[(report.namespace, period.start)] += amount
        if not added:
            return {}
        keys = sorted(added)
        result = await self.session.execute(
            _ADD_USED,
            {
                "namespaces": [namespace for namespace, _ in keys],
                "kinds": [figures[namespace].config.period.value for namespace, _ in keys],
                "starts": [start for _, start in keys],
                "amounts": [added[key] for key in keys],
            },
        )
        return {
            row.namespace: (row.used_gpu_minutes, row.granted_gpu_minutes)
            for row in result
            if row.period_start == period_containing(PeriodKind(row.period_kind), now).start
        }

    async def usage(
        self, namespace: str, since: datetime, until: datetime, group_by: GroupBy
    ) -> list[tuple[str, Decimal, int, float | None]]:
        """Charged GPU-minutes inside [since, until), exactly (charged time clipped to the window and to
        each bucket, share x seconds summed exactly and rounded once per row), grouped by pod, hour or day.
        Raw ledger rows and the hourly aggregates old rows were folded into answer alike."""
        key, piece, bucket = _USAGE_PIECE[group_by]
        query = sa.text(
            f"WITH source AS ({_USAGE_SOURCE}), per_source AS ("
            f"SELECT {key} AS key, s.id, "
            f"sum(s.gpu_share * extract(epoch FROM upper({piece}) - lower({piece}))) AS share_seconds, "
            "max(s.reports) AS reports, max(s.util_sum) AS util_sum, max(s.util_count) AS util_count "
            "FROM source s "
            "CROSS JOIN LATERAL unnest(s.charged * tstzmultirange(tstzrange(:since, :until))) AS r "
            f"{bucket} GROUP BY 1, 2) "
            "SELECT key, round(sum(share_seconds) / 60, 9) AS minutes, sum(reports) AS reports, "
            "sum(util_sum) / nullif(sum(util_count), 0) AS util FROM per_source GROUP BY key ORDER BY key"
        )
        result = await self.session.execute(query, {"namespace": namespace, "since": since, "until": until})
        return [
            (row.key, row.minutes, int(row.reports), None if row.util is None else float(row.util))
            for row in result
        ]
