"""Report ingest: the checks that need settings and the clock, then the IngestService that charges a batch
(read what the plan needs, plan without the database, write the plan); and the usage queries."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.wire import BudgetState
from timekeeper.budgets.burn import attribute, burn_rows, model_burn_rows
from timekeeper.budgets.repository import BudgetRepository
from timekeeper.budgets.states.budget_states import BudgetStates
from timekeeper.clock import Clock
from timekeeper.domain.clusters import split_key
from timekeeper.domain.figures import UNKNOWN_MODEL, NamespaceFigures
from timekeeper.domain.measurements import NO_MEASUREMENTS, GroupBy
from timekeeper.domain.periods import Interval, period_containing
from timekeeper.domain.states import figures_state, model_states
from timekeeper.domain.weights import model_key
from timekeeper.errors import TimekeeperError
from timekeeper.settings import Settings
from timekeeper.usage.measure import Measured
from timekeeper.usage.planning import (
    PlanInputs,
    Rate,
    ReportPlan,
    figures_after,
    plan_model_totals,
    plan_report,
    plan_totals,
)
from timekeeper.usage.repository import (
    BatchRead,
    BatchWritten,
    IngestStatements,
    UsageRepository,
    batch_json,
)
from timekeeper.usage.schemas import ReportIn, UsageOut, UsageRow, stored_gpu

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
    share_differs: bool = False  # the report stated another share than the admitted one it was charged at


class AdmittedShareUnknown(TimekeeperError):
    """The pods table does not hold the pod's admitted share yet, and its reports' shares are not trusted
    (Settings.admitted_share_from_pod): the caller reads the share from the pod and submits the report
    again with it. Answered as it stands, a 503 (retry later), never a charge at the stated share."""

    def __init__(self, pod_uid: str) -> None:
        super().__init__(
            f"the GPU share pod_uid {pod_uid} was admitted at is not known yet; retry later", 503
        )


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What the cluster says of a pod that its reports may not decide: the share it was admitted at and
    its node's GPU model (None: the node does not say), read for its first report (usage/admitted.py)."""

    share: Decimal
    gpu_model: str | None = None


@dataclass(slots=True)
class BatchEntry:
    """One report as its batch carries it, from its arrival to its answer: what the cluster said of its
    pod, what the batch read with the pod locked (IngestStatements.read fills it), its plan, and the
    outcome its caller reads off it. Made afresh for each try of a batch."""

    report: ReportIn
    given_model: str | None = None  # its node's GPU model, read from the cluster (None: not read)
    given_share: Decimal | None = None  # the share its pod was admitted at, read from the cluster
    uncovered: list[Interval] | None = None  # its interval's time not yet charged; None: a foreign pod_uid
    model: str | None = None  # the GPU model its pod is known by
    admitted: Decimal | None = None  # the share its pod was admitted at, where the pods table knows it
    repeated: bool = False  # in the ledger already: answered a duplicate, charges nothing
    plan: ReportPlan | None = None  # what it charges: a new report whose share is known
    mismatch_marked: bool = False  # its pod's share mismatch was first marked by this batch
    outcome: IngestOutcome | TimekeeperError | None = None

    @classmethod
    def of(cls, report: ReportIn, pod: PodFacts | None) -> BatchEntry:
        """A report and what was read of its pod from the cluster (None: the pods table's)."""
        return cls(report) if pod is None else cls(report, pod.gpu_model, pod.share)

    @property
    def pod_uid(self) -> str:
        return self.report.pod_uid

    @property
    def interval_end(self) -> datetime:
        return self.report.interval_end


def _planned(entries: Iterable[BatchEntry]) -> Iterator[tuple[BatchEntry, ReportPlan]]:
    """The entries that have a plan, each with it."""
    for entry in entries:
        if entry.plan is not None:
            yield entry, entry.plan


def reported_model(report: ReportIn) -> str | None:
    """The GPU model the sidecar read from NVML (its first GPU that has a name), in model_key's spelling."""
    return next((model_key(gpu.name) for gpu in report.gpus if gpu.name), None)


def pod_row(
    report: ReportIn, gpu_model: str | None = None, admitted_share: Decimal | None = None
) -> dict[str, Any]:
    """A report as the statements that lock and cover its pod read it (IngestStatements), with the GPU
    model and the admitted share given (the lock reads them: the model the report's own, else the one its
    node gave the caller, the share the one the caller read from the pod; the coverage does not)."""
    return {
        "pod_uid": report.pod_uid,
        "namespace": report.namespace,
        "pod": report.pod,
        "seq": report.seq,
        "interval_start": report.interval_start,
        "interval_end": report.interval_end,
        "final": report.final,
        "gpu_model": gpu_model,
        "admitted_share": None if admitted_share is None else str(admitted_share),
    }


def ledger_row(
    report: ReportIn,
    measured: Measured,
    gpu_minutes: Decimal,
    share: Decimal,
    rate: Rate,
    gpu_model: str | None,
    *,
    covers: bool = True,
) -> dict[str, Any]:
    """A report's ledger row as the ledger insert reads it, with the share it was charged at: amounts as
    exact decimal text; `covers`: its interval holds time its pod has not been charged for, which the
    write adds to the pod's coverage."""
    return {
        **pod_row(report, gpu_model),
        "gpu_share": str(share),
        "gpu_minutes": str(gpu_minutes),
        "charge_share": str(rate.charge_share),
        "gpu_model": gpu_model,
        "mean_sm_util_pct": measured.mean_sm_util_pct,
        "gpus": [stored_gpu(gpu) for gpu in report.gpus],
        "peak_sm_util_pct": measured.peak_sm_util_pct,
        "mem_used_bytes": measured.mem_used_bytes,
        "mean_power_w": None if measured.mean_power_w is None else str(measured.mean_power_w),
        "gpu_status_bits": measured.gpu_status_bits,
        "covers": covers,
    }


def burn_json(charged: Sequence[BatchEntry]) -> str | None:
    """The burn buckets the charged reports add to (budgets/burn.py), as the write reads them."""
    added = attribute(
        (entry.report.namespace, plan.charge.gpu_minutes, entry.uncovered or [])
        for entry, plan in _planned(charged)
    )
    return batch_json(burn_rows(added)) if added else None


def model_burn_json(charged: Sequence[BatchEntry]) -> str | None:
    """The per-model burn buckets (raw GPU-minutes of pods of a known model) the charged reports add to."""
    added = attribute(
        ((entry.report.namespace, entry.model), plan.raw.gpu_minutes, entry.uncovered or [])
        for entry, plan in _planned(charged)
        if entry.model is not None
    )
    return batch_json(model_burn_rows(added)) if added else None


class IngestService:
    """Charges reports in the caller's transaction (the batcher's, or the reconciler's for silent time)."""

    def __init__(self, session: AsyncSession, settings: Settings) -> None:
        self.session = session
        self.usage = UsageRepository(session)
        self.states = BudgetStates(session)
        self.admitted_required = settings.admitted_share_from_pod
        # What a report says about its GPU (NVML's name) and its use (utilisation) may decide a charge only
        # where reports are believed; in Kubernetes auth mode the model is the node's (`given_model`).
        self.reported_models = settings.reports_trusted
        self.reported_utilisation = settings.reports_trusted or settings.trust_reported_utilisation
        self.ledger_retention = settings.ledger_retention

    def raw_since(self, now: datetime) -> datetime | None:
        """Raw ledger rows are kept for reports that end after this (None: none are kept)."""
        return now - self.ledger_retention if self.ledger_retention else None

    async def charge_one(
        self,
        report: ReportIn,
        now: datetime,
        *,
        from_sidecar: bool = True,
        gpu_model: str | None = None,
        admitted_share: Decimal | None = None,
    ) -> IngestOutcome:
        """A batch of one; raises what refused the report."""
        entry = BatchEntry(report, gpu_model or None, admitted_share)
        [outcome] = await self.charge([entry], now, from_sidecar=from_sidecar)
        if isinstance(outcome, TimekeeperError):
            raise outcome
        return outcome

    async def charge(
        self, entries: Sequence[BatchEntry], now: datetime, *, from_sidecar: bool = True
    ) -> list[IngestOutcome | TimekeeperError]:
        """Charge a batch of reports, one per pod at most, in a few round trips whatever its size; answers in
        the entries' order, a refused report changing nothing. `from_sidecar=False` (silent time) keeps the
        pod's last report time; an entry's given model and share stand in for what is not known yet."""
        in_order = sorted(entries, key=lambda entry: entry.pod_uid)
        statements = await IngestStatements.of(self.session)
        read = await self._read(statements, in_order, now, from_sidecar)
        await self._refuse_foreign_pods(in_order)
        accepted = [entry for entry in in_order if entry.uncovered is not None]
        self._plan(accepted, read, from_sidecar)
        fresh = [entry for entry in accepted if entry.plan is not None]
        figures = {f.namespace: f for f in read.figures}
        namespaces = sorted({entry.report.namespace for entry in fresh})
        # Pool members' states are locked and decided together by BudgetStates.store (all members
        # in name order); the batch locks and compares the others' in its write round trip.
        pooled = any(figures[namespace].config.pool is not None for namespace in namespaces)
        written = BatchWritten([], {})
        if fresh:
            written = await self._write(statements, fresh, [] if pooled else namespaces, now)
            _log_share_mismatches(fresh)
        after = figures_after(figures, written.totals, now, written.model_totals)
        states = await self._store_states(
            [after[namespace] for namespace in namespaces], written, pooled, now
        )
        repeated = sorted({entry.report.namespace for entry in accepted if entry.repeated} - set(states))
        states |= await self.states.repository.stored_states(repeated)
        for entry in accepted:
            if entry.repeated:
                entry.outcome = IngestOutcome(
                    True, Decimal(0), states.get(entry.report.namespace, "in_budget")
                )
            elif entry.plan is not None:
                entry.outcome = IngestOutcome(
                    False,
                    entry.plan.charge.gpu_minutes,
                    states[entry.report.namespace],
                    share_differs=entry.plan.differs,
                )
        return [_outcome(entry) for entry in entries]

    async def _read(
        self,
        statements: IngestStatements,
        in_order: Sequence[BatchEntry],
        now: datetime,
        from_sidecar: bool,
    ) -> BatchRead:
        """Lock the batch's pods and read what its plan needs, in one round trip, into the entries."""
        pods = [
            pod_row(
                entry.report,
                (reported_model(entry.report) if self.reported_models else None) or entry.given_model,
                entry.given_share,
            )
            for entry in in_order
        ]
        return await statements.read(
            in_order,
            batch_json(pods),
            sorted({entry.report.namespace for entry in in_order}),
            (
                min(entry.report.interval_start for entry in in_order),
                max(entry.report.interval_end for entry in in_order),
            ),
            now,
            self.raw_since(now),
            from_sidecar=from_sidecar,
        )

    async def _refuse_foreign_pods(self, in_order: Sequence[BatchEntry]) -> None:
        """A 409 for each report whose pod_uid belongs to another namespace (of the report's cluster: a pod
        key holds its cluster; named bare, as the sender named them)."""
        refused = {entry.pod_uid: entry for entry in in_order if entry.uncovered is None}
        if refused:
            for pod_uid, owner in (await self.usage.owners(list(refused))).items():
                refused[pod_uid].outcome = TimekeeperError(
                    f"pod_uid {split_key(pod_uid)[1]} reports for namespace {split_key(owner)[1]}", 409
                )

    def _plan(self, accepted: Sequence[BatchEntry], read: BatchRead, from_sidecar: bool) -> None:
        """Each new report's plan, at its pod's share: the admitted one (kept, else given), else the
        report's where reports are trusted (static auth mode); without one where it is required, the
        report is refused."""
        inputs = PlanInputs(
            {figures.namespace: figures.config.period for figures in read.figures},
            read.bases,
            read.weights,
            self.reported_utilisation,
            from_sidecar,
        )
        for entry in accepted:
            if entry.repeated or entry.uncovered is None:
                continue
            if entry.admitted is None and self.admitted_required:
                entry.outcome = AdmittedShareUnknown(entry.pod_uid)
                continue
            share = entry.report.gpu_share if entry.admitted is None else entry.admitted
            entry.plan = plan_report(entry.report, share, entry.uncovered, entry.model, inputs)

    async def _write(
        self,
        statements: IngestStatements,
        fresh: Sequence[BatchEntry],
        lock_states_of: list[str],
        now: datetime,
    ) -> BatchWritten:
        """Write the plan in one round trip: hourly aggregates, raw ledger rows inside the raw window,
        coverage, totals, burn buckets, and the stored
        states of `lock_states_of` locked."""
        ledger = [
            ledger_row(
                entry.report,
                plan.measured,
                plan.charge.gpu_minutes,
                plan.share,
                plan.rate,
                entry.model,
                covers=bool(entry.uncovered),
            )
            for entry, plan in _planned(fresh)
        ]
        added = plan_totals((entry.report.namespace, plan.charge) for entry, plan in _planned(fresh))
        totals = [
            {"namespace": ns, "period_kind": kind, "period_start": start, "used": str(amount)}
            for (ns, kind, start), amount in added.items()
        ]
        by_model = plan_model_totals(
            (entry.report.namespace, entry.model or UNKNOWN_MODEL, plan.raw)
            for entry, plan in _planned(fresh)
        )
        model_totals = [
            {"namespace": ns, "period_kind": kind, "period_start": start, "model": model, "used": str(amount)}
            for (ns, kind, start, model), amount in by_model.items()
        ]
        raw_since = self.raw_since(now)
        return await statements.write(
            batch_json(ledger),
            0 if raw_since is None else sum(entry.report.interval_end > raw_since for entry in fresh),
            sorted({entry.model for entry in fresh if entry.model is not None}),
            batch_json(totals) if added else None,
            lock_states_of,
            now,
            raw_since,
            burn_json(fresh),
            [entry for entry, plan in _planned(fresh) if plan.differs],
            batch_json(model_totals) if model_totals else None,
            model_burn_json(fresh),
        )

    async def _store_states(
        self, after: list[NamespaceFigures], written: BatchWritten, pooled: bool, now: datetime
    ) -> dict[str, BudgetState]:
        """The charged namespaces' states from their figures after the batch, stored where they moved."""
        changed: set[str] = set()
        if pooled:  # a pool member's state is its pool's: BudgetStates.store decides, for all members
            states, changed = await self.states.store(after, config_changed=False, now=now)
        else:
            states = {figures.namespace: figures_state(figures) for figures in after}
            moved = [
                figures
                for figures in after
                if written.states.get(figures.namespace) != states[figures.namespace]
                or written.model_states.get(figures.namespace, {}) != model_states(figures)
            ]
            if moved:  # BudgetStates.store, for the states that move (the others stay locked as they are)
                changed = (await self.states.store(moved, config_changed=False, now=now))[1]
        for namespace in sorted(changed):
            log.info("namespace_state_changed", extra={"namespace": namespace, "state": states[namespace]})
        return states


def _outcome(entry: BatchEntry) -> IngestOutcome | TimekeeperError:
    if entry.outcome is None:  # a foreign pod_uid whose owner was not found: the batch fails
        raise RuntimeError(f"no outcome for pod_uid {entry.pod_uid}")
    return entry.outcome


def _log_share_mismatches(fresh: Sequence[BatchEntry]) -> None:
    """A pod's first report at another share than its admitted one is logged, once."""
    for entry, plan in _planned(fresh):
        if entry.mismatch_marked:
            log.warning(
                "report_share_differs",
                extra={
                    "namespace": entry.report.namespace,
                    "pod": entry.report.pod,
                    "reported_share": str(entry.report.gpu_share),
                    "admitted_share": str(plan.share),
                },
            )


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
        totals = sum((row.figures for row in found), NO_MEASUREMENTS)
        cluster, bare = split_key(namespace)
        return UsageOut(
            namespace=bare,
            cluster=cluster,
            since=since,
            until=until,
            group_by=group_by,
            total_gpu_minutes=sum((row.gpu_minutes for row in found), Decimal(0)),
            total_raw_gpu_minutes=sum((row.raw_gpu_minutes for row in found), Decimal(0)),
            **totals.answer("total_"),
            rows=[
                UsageRow(
                    key=row.key,
                    gpu_minutes=row.gpu_minutes,
                    raw_gpu_minutes=row.raw_gpu_minutes,
                    reports=row.reports,
                    **row.figures.answer(),
                )
                for row in found
            ],
        )
