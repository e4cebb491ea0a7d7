"""Report ingest: the checks that need settings and the clock, then the IngestService that charges a batch
(read what the plan needs, plan without the database, write the plan); and the usage queries."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.wire import BudgetState
from timekeeper.admission.repository import AdmissionRepository
from timekeeper.admission.service import AdmissionService
from timekeeper.budgets.periods import period_containing
from timekeeper.budgets.repository import BudgetRepository
from timekeeper.clock import Clock
from timekeeper.errors import TimekeeperError
from timekeeper.settings import Settings
from timekeeper.usage.figures import NO_FIGURES, measure
from timekeeper.usage.planning import figures_after, plan_charges, plan_totals
from timekeeper.usage.repository import GroupBy, UsageRepository, batch_json
from timekeeper.usage.schemas import ReportIn, UsageOut, UsageRow

log = logging.getLogger(__name__)


def check_report(settings: Settings, report: ReportIn, now: datetime) -> None:
    """The limits that depend on configuration; the report's own shape pydantic already checked."""
    if report.interval_end - report.interval_start > settings.max_report_interval:
        raise TimekeeperError(
            "interval is longer than the largest accepted "
            f"({settings.max_report_interval.total_seconds():g} s)",
            422,
        )
    if report.interval_start < now - settings.max_report_age:
        raise TimekeeperError(
            "interval_start is older than the oldest accepted "
            f"({settings.max_report_age.total_seconds():g} s ago); that time can no longer be charged",
            422,
        )
    if report.interval_end > now + settings.clock_skew:
        raise TimekeeperError(
            "interval_end is in the future "
            f"(beyond the {settings.clock_skew.total_seconds():g} s skew allowance)",
            422,
        )
    if report.gpu_share > Decimal(str(settings.max_gpu_share)):
        raise TimekeeperError(
            f"gpu_share above the largest believable share ({settings.max_gpu_share:g})", 422
        )


@dataclass(frozen=True, slots=True)
class IngestOutcome:
    duplicate: bool
    gpu_minutes: Decimal
    state: BudgetState


def report_row(report: ReportIn) -> dict[str, Any]:
    """A report as the ingest statements read it (one element of batch_json); amounts as exact decimal
    text, its charge filled in once planned."""
    measured = measure(report)
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
        "gpu_count": measured.gpu_count,
        "mean_sm_util_pct": measured.mean_sm_util_pct,
        "max_mem_used_bytes": measured.max_mem_used_bytes,
        "gpus": [gpu.model_dump() for gpu in report.gpus],
        "peak_sm_util_pct": measured.peak_sm_util_pct,
        "mem_used_bytes": measured.mem_used_bytes,
        "mean_power_w": None if measured.mean_power_w is None else str(measured.mean_power_w),
        "gpu_status_bits": measured.gpu_status_bits,
    }


class IngestService:
    """Charges reports in the caller's transaction (the batcher's, or the reconciler's for silent time)."""

    def __init__(self, session: AsyncSession, settings: Settings) -> None:
        self.usage = UsageRepository(session)
        self.budgets = BudgetRepository(session)
        self.admission = AdmissionService(session, settings)
        self.states = AdmissionRepository(session)

    async def charge_one(
        self, report: ReportIn, now: datetime, *, from_sidecar: bool = True
    ) -> IngestOutcome:
        """A batch of one; raises what refused the report."""
        [outcome] = await self.charge([report], now, from_sidecar=from_sidecar)
        if isinstance(outcome, TimekeeperError):
            raise outcome
        return outcome

    async def charge(
        self, reports: Sequence[ReportIn], now: datetime, *, from_sidecar: bool = True
    ) -> list[IngestOutcome | TimekeeperError]:
        """Charge a batch of reports, at most one per pod: for each, the part of its interval its pod has
        not been charged for, split at period boundaries, with its ledger row, its pod's coverage, the
        running totals and its namespace's state. The same few statements whatever the batch's size.
        Answers in the reports' order; a report refused (its pod_uid belongs to another namespace) gets
        its error and changes nothing. `from_sidecar=False` (the reconciler charging silent time) leaves
        the pod's last report time alone."""
        in_order = sorted(reports, key=lambda report: report.pod_uid)
        figures = {
            f.namespace: f
            for f in await self.budgets.figures(now, sorted({report.namespace for report in in_order}))
        }
        rows = {report.pod_uid: report_row(report) for report in in_order}
        uncovered = await self.usage.lock_pods(
            batch_json([rows[report.pod_uid] for report in in_order]), now, from_sidecar=from_sidecar
        )
        outcomes: dict[str, IngestOutcome | TimekeeperError] = {}
        refused = [report.pod_uid for report in in_order if report.pod_uid not in uncovered]
        if refused:
            for pod_uid, owner in (await self.usage.owners(refused)).items():
                outcomes[pod_uid] = TimekeeperError(f"pod_uid {pod_uid} reports for namespace {owner}", 409)
        accepted = [report for report in in_order if report.pod_uid in uncovered]
        charges = plan_charges(accepted, uncovered, {ns: f.config for ns, f in figures.items()})
        new: set[str] = set()
        if accepted:
            for report in accepted:
                rows[report.pod_uid]["gpu_minutes"] = str(charges[report.pod_uid].gpu_minutes)
            new = await self.usage.insert_ledger(
                batch_json([rows[report.pod_uid] for report in accepted]), now
            )
        fresh = [report for report in accepted if report.pod_uid in new]
        covering = [rows[report.pod_uid] for report in fresh if uncovered[report.pod_uid]]
        if covering:
            await self.usage.cover(batch_json(covering))
        totals = await self.usage.add_used(plan_totals(fresh, charges))
        after = figures_after(figures, totals, now)
        states, changed = await self.admission.record(
            [after[namespace] for namespace in sorted({report.namespace for report in fresh})],
            config_changed=False,
        )
        for namespace in sorted(changed):
            log.info("namespace_state_changed", extra={"namespace": namespace, "state": states[namespace]})
        repeated = sorted(
            {report.namespace for report in accepted if report.pod_uid not in new} - set(states)
        )
        states |= await self.states.stored_states(repeated)
        for report in accepted:
            if report.pod_uid in new:
                outcomes[report.pod_uid] = IngestOutcome(
                    False, charges[report.pod_uid].gpu_minutes, states[report.namespace]
                )
            else:
                outcomes[report.pod_uid] = IngestOutcome(
                    True, Decimal(0), states.get(report.namespace, "in_budget")
                )
        return [outcomes[report.pod_uid] for report in reports]


class UsageService:
    def __init__(self, session: AsyncSession, settings: Settings, clock: Clock) -> None:
        self.repository = UsageRepository(session)
        self.budgets = BudgetRepository(session)
        self.settings = settings
        self.clock = clock

    async def usage(
        self, namespace: str, since: datetime | None, until: datetime | None, group_by: GroupBy
    ) -> UsageOut:
        """Defaults: from the start of the namespace's current period until now."""
        now = self.clock.now()
        if since is None:
            config = await self.budgets.effective(namespace)
            since = period_containing(config.period, now).start
        until = until or now
        if until <= since:
            raise TimekeeperError("until must be after since", 422)
        found = await self.repository.usage(namespace, since, until, group_by)
        totals = sum((figures for _, _, _, figures in found), NO_FIGURES)
        return UsageOut(
            namespace=namespace,
            since=since,
            until=until,
            group_by=group_by,
            total_gpu_minutes=sum((minutes for _, minutes, _, _ in found), Decimal(0)),
            **totals.answer("total_"),
            rows=[
                UsageRow(
                    key=key,
                    gpu_minutes=minutes,
                    reports=reports,
                    **figures.answer(),
                )
                for key, minutes, reports, figures in found
            ],
        )
