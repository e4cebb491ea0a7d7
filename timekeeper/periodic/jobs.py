"""The periodic jobs. Each has a window (the stretch of time one execution is responsible for) and does
its work in one transaction together with the job_runs row of that window, so a re-run, a crash mid-run
or a second replica running the same window changes nothing. A reconcile pass, which writes in sessions
of its own and waits on API servers, claims its window in a short transaction of its own instead."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from timekeeper.budgets.burn import PURGE_MARGIN, BurnRepository
from timekeeper.budgets.repository import BudgetRepository
from timekeeper.budgets.service import end_expired_grants
from timekeeper.budgets.states.budget_states import BudgetStates
from timekeeper.clock import Clock
from timekeeper.domain.periods import EPOCH, PeriodKind, period_containing
from timekeeper.periodic.repository import Folded, PeriodicRepository
from timekeeper.settings import Settings
from timekeeper.usage.partitions import days_ahead, ensure_days

_HOUR = timedelta(hours=1)


def floor_to(moment: datetime, step: timedelta) -> datetime:
    """The start of the step-long slot (counted from the Unix epoch) that the moment falls in."""
    return EPOCH + (moment - EPOCH) // step * step


class PeriodicService:
    """The jobs' work; the caller owns the transaction (run_job commits it)."""

    def __init__(
        self,
        session: AsyncSession,
        settings: Settings,
        sessions: async_sessionmaker[AsyncSession] | None = None,
    ) -> None:
        self.repository = PeriodicRepository(session)
        # For work committed piece by piece, apart from the window's transaction (the fold's hours).
        self.sessions = sessions
        self.states = BudgetStates(session)
        self.budgets = BudgetRepository(session)
        self.burn = BurnRepository(session)
        self.settings = settings

    async def refresh_all_states(self, now: datetime, window: datetime) -> dict[str, Any]:
        """Recompute every known namespace's state against the totals of its current period, grants past their
        expiry ended first. After a UTC midnight this is the period roll-over (new totals start at zero);
        otherwise it stores what no report has yet (a budget's new period kind, say)."""
        await self.repository.lock_states()
        expired = await end_expired_grants(self.budgets, now)
        await self.states.refresh(now, None, config_changed=False)
        return {"grants_expired_in": expired} if expired else {}

    async def close_out(self, now: datetime, window: datetime) -> dict[str, Any]:
        """Pods silent for closeout_after_intervals report intervals stop counting as running."""
        silence = self.settings.report_interval * self.settings.closeout_after_intervals
        closed = await self.repository.close_out(now, now - silence)
        return {
            "closed": [{"namespace": ns, "pod": pod, "pod_uid": uid} for ns, pod, uid in closed],
            "running": await self.repository.running_pods(),
        }

    async def roll_up(self, now: datetime, window: datetime) -> dict[str, Any]:
        """Remove the raw ledger rows that ended before the window's start (coverage, totals and the hourly
        aggregates untouched: ingest wrote the history as it charged), whole day partitions dropped, and
        drop the burn buckets older than the forecast's window and a margin, in the window's transaction;
        before that, fold the pod-hours of the hours that ended TIMEKEEPER_HOURLY_HISTORY ago into their
        days (fold_hours: a transaction per hour), so no lock the pruning takes is held while they fold."""
        folded = await self.fold_hours(floor_to(now - self.settings.hourly_history, _HOUR))
        pruned = await self.repository.prune_ledger(window)
        oldest = now - timedelta(minutes=self.settings.forecast_window_minutes) - PURGE_MARGIN
        purged = await self.burn.purge(oldest)
        return {
            "deleted_rows": pruned.deleted,
            "partitions_dropped": pruned.dropped,
            "hours_folded": folded.hours,
            "pod_hours_folded": folded.rows,
            "burn_buckets_purged": purged,
        }

    async def fold_hours(self, before: datetime) -> Folded:
        """Fold the pod-hours of every hour that starts before `before` into their days, oldest first: one
        statement (FOLD_HOUR) and one transaction per hour, so no statement grows with the day and no lock
        is held past its hour. An hour is in its rows or its day, never both, so a crash between hours
        leaves nothing to undo: the next run folds the rest. A late report's hour (folded before) is found
        as any other: every hour before `before` is folded, however old."""
        assert self.sessions is not None, "the fold commits hour by hour on sessions of its own"
        hours = rows = 0
        after = EPOCH
        while True:
            async with self.sessions() as session, session.begin():
                repository = PeriodicRepository(session)
                hour = await repository.next_hour(after, before)
                if hour is None:
                    return Folded(hours, rows)
                rows += await repository.fold_hour(hour)
            hours, after = hours + 1, hour

    async def ledger_partitions(self, now: datetime, window: datetime) -> dict[str, Any]:
        """Create the ledger's day partitions from today to ledger_partitions_ahead days on."""
        days = days_ahead(now, self.settings.ledger_partitions_ahead)
        return {"partitions_created": await ensure_days(self.repository.session, days)}


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    interval: Callable[[Settings], timedelta]
    window: Callable[[datetime, Settings], datetime]
    work: Callable[[PeriodicService, datetime, datetime], Awaitable[dict[str, Any]]]
    # Awaited before the window is claimed, outside any transaction (the reconcile pass waits there for
    # a new leader's pod watch to list the pods); raising fails the execution.
    prepare: Callable[[], Awaitable[None]] | None = None
    # False: the work opens its own transactions (the reconcile pass): the window is claimed and committed
    # first, and no transaction stays open while the work waits (on an API server, say), holding a pooled
    # connection and back vacuum. A window whose work fails is given back; one whose replica dies
    # mid-work (or loses leadership) stays claimed, and the next window runs.
    in_transaction: bool = True


JOBS: tuple[Job, ...] = (
    Job(
        "rollover",
        lambda s: s.rollover_interval,
        lambda now, s: period_containing(PeriodKind.DAILY, now).start,
        PeriodicService.refresh_all_states,
    ),
    Job(
        "states",
        lambda s: s.states_interval,
        lambda now, s: floor_to(now, s.states_interval),
        PeriodicService.refresh_all_states,
    ),
    Job(
        "closeout",
        lambda s: s.closeout_interval,
        lambda now, s: floor_to(now, s.closeout_interval),
        PeriodicService.close_out,
    ),
    Job(
        "rollup",
        lambda s: s.rollup_interval,
        lambda now, s: floor_to(now - s.ledger_retention, s.rollup_interval),
        PeriodicService.roll_up,
    ),
    Job(
        "partitions",
        lambda s: s.partitions_interval,
        lambda now, s: floor_to(now, s.partitions_interval),
        PeriodicService.ledger_partitions,
    ),
)
JOBS_BY_NAME = {job.name: job for job in JOBS}


class PassResult(Protocol):
    def as_detail(self) -> dict[str, Any]: ...


class LeaderPass(Protocol):
    """A pass that needs state of the leader's own before it runs (the reconciler's pod watch)."""

    async def wait_synced(self) -> None: ...

    async def run_pass(self) -> PassResult: ...


def reconcile_job_name(cluster: str | None) -> str:
    """`reconcile` for the local cluster's passes, `reconcile:<cluster>` for a fleet member's."""
    return "reconcile" if cluster is None else f"reconcile:{cluster}"


def reconcile_job(reconciler: LeaderPass, cluster: str | None = None) -> Job:
    """The reconcile pass of one cluster (None: the local one) as a job: every reconcile interval, on the
    leader, once per window; no window is claimed before the leader's pod watch has listed the pods. Each
    cluster's is a job of its own, so a member whose API server is away fails (and is counted and
    alerted on as) its own job, and the others' passes run. A member's pass ends (TimeoutError) after one
    interval: its API server may answer slowly but forever, and the next window starts a pass anew."""

    def interval(settings: Settings) -> timedelta:
        return timedelta(seconds=settings.reconcile_interval_seconds)

    async def work(service: PeriodicService, now: datetime, window: datetime) -> dict[str, Any]:
        limit = None if cluster is None else interval(service.settings).total_seconds()
        async with asyncio.timeout(limit):
            return (await reconciler.run_pass()).as_detail()

    return Job(
        reconcile_job_name(cluster),
        interval,
        lambda now, settings: floor_to(now, interval(settings)),
        work,
        prepare=reconciler.wait_synced,
        in_transaction=False,
    )


@dataclass(frozen=True, slots=True)
class JobResult:
    window: datetime
    detail: dict[str, Any] | None  # None: the window had already run


async def run_job(
    job: Job,
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    clock: Clock,
    replica: str,
) -> JobResult:
    """One execution: claim the window, do the work, record it, commit, all or nothing (for a job not
    `in_transaction`: claim and commit, do the work, record it, or give the window back)."""
    if job.prepare is not None:
        await job.prepare()
    now = clock.now()
    window = job.window(now, settings)
    if not job.in_transaction:
        return await _run_outside(job, sessionmaker, settings, now, window, replica)
    async with sessionmaker() as session, session.begin():
        service = PeriodicService(session, settings, sessionmaker)
        if not await service.repository.claim(job.name, window, now, replica):
            return JobResult(window, None)
        detail = await job.work(service, now, window)
        await service.repository.record(job.name, window, detail)
        return JobResult(window, detail)


async def _run_outside(
    job: Job,
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    now: datetime,
    window: datetime,
    replica: str,
) -> JobResult:
    """run_job for a job that opens its own transactions: the window's claim and its record each in a
    short transaction, the work between them in none (its service's session is never used)."""
    async with sessionmaker() as session, session.begin():
        if not await PeriodicRepository(session).claim(job.name, window, now, replica):
            return JobResult(window, None)
    try:
        async with sessionmaker() as session:
            detail = await job.work(PeriodicService(session, settings), now, window)
    except Exception:
        async with sessionmaker() as session, session.begin():
            await PeriodicRepository(session).release(job.name, window)
        raise
    async with sessionmaker() as session, session.begin():
        await PeriodicRepository(session).record(job.name, window, detail)
    return JobResult(window, detail)
