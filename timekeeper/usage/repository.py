"""SQL for the usage ledger: the report ingest path (one function, core SQL) and the usage queries."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.wire import BudgetState
from timekeeper.admission.repository import AdmissionRepository
from timekeeper.budgets.periods import budget_state, period_containing
from timekeeper.budgets.repository import BudgetRepository
from timekeeper.errors import TimekeeperError
from timekeeper.usage.charging import split_charge
from timekeeper.usage.schemas import ReportIn

# Creates the pod's row on its first report and locks it, so one pod's reports are charged one at a time;
# answers the part of the interval not yet charged.
_LOCK_POD = sa.text(
    "INSERT INTO pod_coverage (pod_uid, namespace, pod, covered, last_seq, last_report_at, final) "
    "VALUES (:pod_uid, :namespace, :pod, '{}', :seq, :now, false) "
    "ON CONFLICT (pod_uid) DO UPDATE SET last_report_at = excluded.last_report_at "
    "RETURNING namespace, tstzmultirange(tstzrange(:interval_start, :interval_end)) - covered AS uncovered"
)
_INSERT_LEDGER = sa.text(
    "INSERT INTO usage_ledger (namespace, pod, pod_uid, seq, interval_start, interval_end, gpu_share, "
    "charged, gpu_minutes, final, received_at, gpu_count, mean_sm_util_pct, max_mem_used_bytes, gpus) "
    "VALUES (:namespace, :pod, :pod_uid, :seq, :interval_start, :interval_end, :gpu_share, "
    "tstzmultirange(tstzrange(:interval_start, :interval_end)) "
    "- (SELECT covered FROM pod_coverage WHERE pod_uid = :pod_uid), "
    ":gpu_minutes, :final, :now, :gpu_count, :mean_sm_util_pct, :max_mem_used_bytes, CAST(:gpus AS jsonb)) "
    "ON CONFLICT ON CONSTRAINT uq_usage_ledger_report DO NOTHING RETURNING id"
)
_COVER = sa.text(
    "UPDATE pod_coverage SET covered = covered + tstzmultirange(tstzrange(:interval_start, :interval_end)), "
    "last_seq = :seq, pod = :pod, final = final OR :final WHERE pod_uid = :pod_uid"
)
_ADD_USED = sa.text(
    "INSERT INTO usage_totals (namespace, period_kind, period_start, used_gpu_minutes) "
    "VALUES (:namespace, :kind, :start, :amount) ON CONFLICT (namespace, period_kind, period_start) "
    "DO UPDATE SET used_gpu_minutes = usage_totals.used_gpu_minutes + excluded.used_gpu_minutes "
    "RETURNING used_gpu_minutes, granted_gpu_minutes"
)

GroupBy = Literal["pod", "hour", "day"]
_USAGE_PIECE = {
    "pod": ("l.pod", "r", ""),
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


@dataclass(frozen=True, slots=True)
class IngestOutcome:
    duplicate: bool
    gpu_minutes: Decimal
    state: BudgetState
    state_changed: bool = False


class UsageRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def ingest(self, report: ReportIn, now: datetime) -> IngestOutcome:
        """Charge one report: the uncovered part of its interval, split at period boundaries, with the
        ledger row, the pod's coverage, the running totals and the namespace's state in this transaction."""
        session = self.session
        budgets = BudgetRepository(session)
        admission = AdmissionRepository(session)
        config = await budgets.effective(report.namespace)
        gpu_count, mean_util, max_memory = report.measured()
        params: dict[str, Any] = {
            "namespace": report.namespace,
            "pod": report.pod,
            "pod_uid": report.pod_uid,
            "seq": report.seq,
            "interval_start": report.interval_start,
            "interval_end": report.interval_end,
            "gpu_share": report.gpu_share,
            "final": report.final,
            "now": now,
        }
        pod = (await session.execute(_LOCK_POD, params)).one()
        if pod.namespace != report.namespace:
            raise TimekeeperError(f"pod_uid {report.pod_uid} reports for namespace {pod.namespace}", 409)
        uncovered = [(piece.lower, piece.upper) for piece in pod.uncovered]
        charges = split_charge(report.gpu_share, uncovered, config.period)
        charged = sum((amount for _, amount in charges), Decimal(0))
        ledger_row = (
            await session.execute(
                _INSERT_LEDGER,
                {
                    **params,
                    "gpu_minutes": charged,
                    "gpu_count": gpu_count,
                    "mean_sm_util_pct": mean_util,
                    "max_mem_used_bytes": max_memory,
                    "gpus": json.dumps([gpu.model_dump() for gpu in report.gpus]),
                },
            )
        ).first()
        if ledger_row is None:
            stored = await admission.stored_state(report.namespace)
            return IngestOutcome(True, Decimal(0), stored or "in_budget")
        if uncovered:
            await session.execute(_COVER, params)
        current = period_containing(config.period, now)
        current_totals: tuple[Decimal, Decimal] | None = None
        for period, amount in charges:
            totals = (
                await session.execute(
                    _ADD_USED,
                    {
                        "namespace": report.namespace,
                        "kind": config.period.value,
                        "start": period.start,
                        "amount": amount,
                    },
                )
            ).one()
            if period.start == current.start:
                current_totals = (totals.used_gpu_minutes, totals.granted_gpu_minutes)
        if config.budget_gpu_minutes is None:
            state: BudgetState = "unlimited"
        else:
            if current_totals is None:
                current_totals = await budgets.totals(report.namespace, config.period, current.start)
            used, granted = current_totals
            state = budget_state(config.budget_gpu_minutes, granted, used, config.warn_at_fraction)
        changed = await admission.set_states({report.namespace: state})
        if changed:
            await admission.bump_version()
        return IngestOutcome(False, charged, state, changed)

    async def usage(
        self, namespace: str, since: datetime, until: datetime, group_by: GroupBy
    ) -> list[tuple[str, Decimal, int, float | None]]:
        """Charged GPU-minutes inside [since, until), exactly (charged time clipped to the window and to
        each bucket), grouped by pod, hour or day."""
        key, piece, bucket = _USAGE_PIECE[group_by]
        query = sa.text(
            f"SELECT {key} AS key, "
            f"sum(round(l.gpu_share * extract(epoch FROM upper({piece}) - lower({piece})) / 60, 9)) "
            "AS minutes, "
            "count(DISTINCT l.id) AS reports, avg(l.mean_sm_util_pct) AS util "
            "FROM usage_ledger l "
            "CROSS JOIN LATERAL unnest(l.charged * tstzmultirange(tstzrange(:since, :until))) AS r "
            f"{bucket} "
            "WHERE l.namespace = :namespace AND l.interval_end > :since AND l.interval_start < :until "
            "GROUP BY 1 ORDER BY 1"
        )
        result = await self.session.execute(query, {"namespace": namespace, "since": since, "until": until})
        return [
            (row.key, row.minutes, int(row.reports), None if row.util is None else float(row.util))
            for row in result
        ]
