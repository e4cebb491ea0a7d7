"""Runs the jobs on APScheduler while this replica leads, and keeps each job's health for /metrics and
/readyz."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from timekeeper.clock import Clock
from timekeeper.periodic.jobs import JOBS, Job, run_job
from timekeeper.periodic.leader import LeaderElection
from timekeeper.settings import Settings

log = logging.getLogger(__name__)
OUTCOMES = ("ok", "skipped", "error", "cancelled")


def replica_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class JobHealth:
    """The last execution of one job on this replica (wall-clock times, whatever the service's clock)."""

    last_run: datetime | None = None
    duration_seconds: float | None = None
    outcome: str | None = None  # ok, skipped (window already done), error, cancelled (leadership lost)
    window: datetime | None = None
    last_success: datetime | None = None

    def as_json(self) -> dict[str, Any]:
        def stamp(value: datetime | None) -> str | None:
            return None if value is None else value.isoformat()

        return {
            "last_run": stamp(self.last_run),
            "duration_seconds": self.duration_seconds,
            "outcome": self.outcome,
            "window": stamp(self.window),
            "last_success": stamp(self.last_success),
        }


class LeaderService(Protocol):
    """Work that runs only while this replica leads, beside the jobs it feeds (the reconciler's pod
    watch): started before the jobs on election, stopped after them when leadership is lost."""

    async def start_leading(self) -> None: ...

    async def stop_leading(self) -> None: ...

    async def aclose(self) -> None: ...


class PeriodicRunner:
    def __init__(
        self,
        database_url: str,
        sessionmaker: async_sessionmaker[AsyncSession],
        settings: Settings,
        clock: Clock,
        registry: CollectorRegistry | None = None,
        jobs: tuple[Job, ...] = JOBS,
        services: tuple[LeaderService, ...] = (),
        collectors: tuple[Collector, ...] = (),
    ) -> None:
        self.sessionmaker = sessionmaker
        self.settings = settings
        self.clock = clock
        self.jobs = jobs
        self.services = services
        self.replica = replica_name()
        self.health = {job.name: JobHealth() for job in jobs}
        self.counts = {(job.name, outcome): 0 for job in jobs for outcome in OUTCOMES}
        self.election = LeaderElection(
            database_url,
            settings.scheduler_lock_key,
            settings.leader_retry_interval.total_seconds(),
            self._start_jobs,
            self._stop_jobs,
            None if settings.leader_check_timeout is None else settings.leader_check_timeout.total_seconds(),
        )
        self._scheduler: AsyncIOScheduler | None = None
        self._running: set[asyncio.Task[Any]] = set()
        self._task: asyncio.Task[None] | None = None
        self._registry = registry
        self._collectors = (PeriodicCollector(self), *collectors)

    @property
    def leading(self) -> bool:
        return self.election.leading

    def start(self) -> None:
        """Compete for leadership from now on (in the background); health goes into the registry."""
        if self._registry is not None:
            for collector in self._collectors:
                self._registry.register(collector)
        self._task = asyncio.create_task(self.election.run(), name="scheduler-leader-election")

    async def stop(self) -> None:
        """Stop the jobs and release the lock (closing its session), so another replica takes over."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for service in self.services:
            await service.aclose()
        if self._registry is not None:
            for collector in self._collectors:
                self._registry.unregister(collector)

    async def _start_jobs(self) -> None:
        for service in self.services:
            await service.start_leading()
        scheduler = AsyncIOScheduler(timezone=UTC)
        for job in self.jobs:
            scheduler.add_job(
                self._execute,
                IntervalTrigger(seconds=job.interval(self.settings).total_seconds()),
                args=(job,),
                id=job.name,
                max_instances=1,
                coalesce=True,
                misfire_grace_time=None,
                next_run_time=datetime.now(UTC),
            )
        scheduler.start()
        self._scheduler = scheduler

    async def _stop_jobs(self) -> None:
        """No new runs, and the ones under way are cancelled: their transactions roll back."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        for task in list(self._running):
            task.cancel()
        for service in self.services:
            await service.stop_leading()

    async def _execute(self, job: Job) -> None:
        if not self.leading:
            return
        task = asyncio.current_task()
        assert task is not None
        self._running.add(task)
        health = self.health[job.name]
        started, began = datetime.now(UTC), time.perf_counter()
        try:
            result = await run_job(job, self.sessionmaker, self.settings, self.clock, self.replica)
        except asyncio.CancelledError:
            outcome = "cancelled"
        except Exception:
            log.exception("scheduler_job_failed", extra={"job": job.name})
            outcome = "error"
        else:
            outcome = "skipped" if result.detail is None else "ok"
            health.window = result.window
            if result.detail is not None:
                health.last_success = started
                log.info("scheduler_job_ran", extra={"job": job.name, "window": result.window.isoformat()})
        finally:
            self._running.discard(task)
        health.last_run, health.outcome = started, outcome
        health.duration_seconds = time.perf_counter() - began
        self.counts[job.name, outcome] += 1

    def status(self) -> dict[str, Any]:
        """For /readyz: who this replica is, whether it leads, and each job's last execution here."""
        return {
            "replica": self.replica,
            "leader": self.leading,
            "jobs": {name: health.as_json() for name, health in self.health.items()},
        }


class PeriodicCollector(Collector):
    """Leadership and job health as Prometheus metrics."""

    def __init__(self, runner: PeriodicRunner) -> None:
        self.runner = runner

    def collect(self) -> Iterator[Metric]:
        runner = self.runner
        leader = GaugeMetricFamily(
            "timekeeper_scheduler_leader", "1 when this replica runs the periodic jobs", labels=["replica"]
        )
        leader.add_metric([runner.replica], 1.0 if runner.leading else 0.0)
        last_run = GaugeMetricFamily(
            "timekeeper_job_last_run_timestamp_seconds", "When the job last ran here", labels=["job"]
        )
        last_success = GaugeMetricFamily(
            "timekeeper_job_last_success_timestamp_seconds",
            "When the job last did its window's work here",
            labels=["job"],
        )
        duration = GaugeMetricFamily(
            "timekeeper_job_last_duration_seconds", "How long the job's last run took", labels=["job"]
        )
        outcome = GaugeMetricFamily(
            "timekeeper_job_last_outcome", "1 for the job's last outcome", labels=["job", "outcome"]
        )
        runs = CounterMetricFamily("timekeeper_job_runs", "Job runs by outcome", labels=["job", "outcome"])
        for name, health in runner.health.items():
            if health.last_run is not None:
                last_run.add_metric([name], health.last_run.timestamp())
            if health.last_success is not None:
                last_success.add_metric([name], health.last_success.timestamp())
            if health.duration_seconds is not None:
                duration.add_metric([name], health.duration_seconds)
            for candidate in OUTCOMES:
                outcome.add_metric([name, candidate], 1.0 if candidate == health.outcome else 0.0)
                runs.add_metric([name, candidate], runner.counts[name, candidate])
        yield from (leader, last_run, last_success, duration, outcome, runs)


@dataclass(frozen=True, slots=True)
class LeaderWork:
    """What the leader runs beside JOBS: more jobs, services it starts and stops, their metrics."""

    jobs: tuple[Job, ...] = ()
    services: tuple[LeaderService, ...] = ()
    collectors: tuple[Collector, ...] = ()


# Builds the LeaderWork for these settings (timekeeper.app.leader_work: the reconcile pass, the GitOps sync).
BuildLeaderWork = Callable[[Settings, async_sessionmaker[AsyncSession], Clock], Awaitable[LeaderWork]]


async def build_runner(
    database_url: str,
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    clock: Clock,
    registry: CollectorRegistry | None,
    leader_work: BuildLeaderWork | None = None,
) -> PeriodicRunner:
    """The runner with every job, and the work `leader_work` builds (all the leader's alone), wherever
    the periodic jobs run: in the API process or on its own."""
    work = LeaderWork() if leader_work is None else await leader_work(settings, sessionmaker, clock)
    return PeriodicRunner(
        database_url,
        sessionmaker,
        settings,
        clock,
        registry,
        (*JOBS, *work.jobs),
        work.services,
        work.collectors,
    )
