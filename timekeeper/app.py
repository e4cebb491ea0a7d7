"""The application factory. Everything with I/O (engine, embedded database, access control) is built in
the lifespan, into the one context its routes reach (timekeeper/context.py); the factory itself only
wires objects together."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI
from prometheus_client.registry import Collector
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpuaccounting.names import API_PREFIX
from httpguard.bodies import BodyLimit, BodyTooLarge
from timekeeper.audit.router import router as audit_router
from timekeeper.auth.dependencies import ACCESS, METRICS_TOKENS
from timekeeper.auth.digests import TokenDigests
from timekeeper.auth.factory import build_access_control
from timekeeper.auth.router import router as auth_router
from timekeeper.billing.chargeback import ChargebackExports
from timekeeper.billing.router import CHARGEBACK_EXPORTS
from timekeeper.billing.router import namespaced as billing_namespaced_router
from timekeeper.billing.router import router as billing_router
from timekeeper.budgets.pools.router import router as pools_router
from timekeeper.budgets.router import router as budgets_router
from timekeeper.budgets.states.repository import known_namespaces
from timekeeper.clock import Clock
from timekeeper.context import Context
from timekeeper.db.session import (
    build_engine,
    build_export_engine,
    build_read_sessionmaker,
    build_sessionmaker,
    resolve_database_url,
)
from timekeeper.health.router import router as health_router
from timekeeper.metrics import METRICS, Metrics
from timekeeper.periodic.jobs import Job, reconcile_job
from timekeeper.periodic.runner import LeaderService, LeaderWork, build_runner
from timekeeper.refusals import install_error_handler
from timekeeper.schemas import API_ERRORS
from timekeeper.settings import Settings, get_settings
from timekeeper.snapshot.router import SNAPSHOT_CACHE
from timekeeper.snapshot.router import router as snapshot_router
from timekeeper.snapshot.service import SnapshotCache
from timekeeper.ui import mount_docs, mount_ui
from timekeeper.usage.batcher import IngestBatcher
from timekeeper.usage.partitions import days_ahead, ensure_days
from timekeeper.usage.router import INGEST, POD_SHARES
from timekeeper.usage.router import router as usage_router

if TYPE_CHECKING:
    from timekeeper.usage.admitted import PodShares


def _too_large(refusal: BodyTooLarge) -> bytes:
    detail = f"request body larger than {refusal.limit} bytes"
    return json.dumps({"detail": detail}, separators=(",", ":")).encode()


log = logging.getLogger(__name__)


def default_clock(settings: Settings) -> Clock:
    return settings.clock()


def current(app: FastAPI) -> Context:
    """The started app's context: what the batcher's and the exports' session getters read, so that a
    context a test exposes is the one they use."""
    context: Context = app.state.context
    return context


def expose(app: FastAPI, context: Context) -> None:
    """Makes `context` the one its routes reach (timekeeper.context.ContextDep)."""
    app.state.context = context


@asynccontextmanager
async def run_context(app: FastAPI, settings: Settings, clock: Clock) -> AsyncIterator[Context]:
    """Builds the context (engines, access control, the batcher, the caches and, when scheduler_enabled,
    this replica competing to run the jobs), exposes it on `app`, and closes it all at the end."""
    url = await resolve_database_url(settings)
    engine = build_engine(url, settings.database_pool_size)
    export_engine = build_export_engine(url, settings)
    sessions = build_sessionmaker(engine)
    access = await build_access_control(settings)
    await create_ledger_partitions(sessions, settings, clock)
    pod_shares: dict[str | None, PodShares] | None = None
    if settings.admitted_share_from_pod:  # the Kubernetes client only where it is used
        from timekeeper.usage.admitted import build_pod_shares

        pod_shares = await build_pod_shares(settings, clock)
    metrics = Metrics()
    metrics.outages.attach(engine)
    ingest = IngestBatcher(lambda: current(app).sessions, settings, clock, metrics)
    exports = ChargebackExports(
        lambda: current(app).export_sessions,
        settings.chargeback_exports,
        settings.chargeback_export_wait_seconds,
    )
    runner = None
    if settings.scheduler_enabled:
        database_url = engine.url.render_as_string(hide_password=False)
        runner = await build_runner(database_url, sessions, settings, clock, metrics.registry, leader_work)
    context = Context(
        settings=settings,
        clock=clock,
        engine=engine,
        sessions=sessions,
        reads=build_read_sessionmaker(engine),
        export_engine=export_engine,
        export_sessions=build_sessionmaker(export_engine),
        known_namespaces=known_namespaces,
        scheduler=runner,
        parts={
            ACCESS: access,
            METRICS_TOKENS: TokenDigests(settings.metrics_token_sha256),
            METRICS: metrics,
            INGEST: ingest,
            POD_SHARES: pod_shares,
            SNAPSHOT_CACHE: SnapshotCache(),
            CHARGEBACK_EXPORTS: exports,
        },
    )
    expose(app, context)
    ingest.start()
    if runner is not None:
        runner.start()
    try:
        yield context
    finally:
        if runner is not None:
            await runner.stop()
        await ingest.aclose()
        await access.aclose()
        for shares in (pod_shares or {}).values():
            await shares.aclose()
        await engine.dispose()
        await export_engine.dispose()


async def create_ledger_partitions(
    sessionmaker: async_sessionmaker[AsyncSession], settings: Settings, clock: Clock
) -> None:
    """The ledger's day partitions ahead, at start-up (the leader's job keeps them so); a database not
    reachable yet leaves it to the job (a report meanwhile lands in the default partition)."""
    try:
        async with sessionmaker() as session, session.begin():
            await ensure_days(session, days_ahead(clock.now(), settings.ledger_partitions_ahead))
    except (OSError, DBAPIError):
        log.warning("ledger_partitions_not_created", exc_info=True)


async def leader_work(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], clock: Clock
) -> LeaderWork:
    """With `reconcile`, the reconcile pass and the pod watch it needs; with `gitops`, the GPUBudget sync."""
    jobs: tuple[Job, ...] = ()
    services: tuple[LeaderService, ...] = ()
    collectors: tuple[Collector, ...] = ()
    # Imported only when asked for: they need a cluster, and the Kubernetes client costs a process about
    # 50 MB and seconds of start-up (docs/kubernetes.md).
    if settings.reconcile:
        from timekeeper.reconcile.service import build_reconcilers

        # One pass per cluster: the local one's, and each member's (docs/fleet.md).
        reconcilers = await build_reconcilers(settings, sessionmaker, clock)
        jobs = (*jobs, *(reconcile_job(r, r.cluster) for r in reconcilers.clusters))
        services = (*services, *reconcilers.clusters)
        collectors = (*collectors, reconcilers.pod_metrics, reconcilers.downgrade_metrics)
    if settings.gitops:
        from timekeeper.gitops.sync import build_gitops_sync

        sync = await build_gitops_sync(settings, sessionmaker, clock)
        services, collectors = (*services, sync), (*collectors, sync.metrics)
    return LeaderWork(jobs, services, collectors)


def create_app(settings: Settings | None = None, clock: Clock | None = None) -> FastAPI:
    settings = settings or get_settings()
    clock = clock or default_clock(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with run_context(app, settings, clock):
            yield

    app = FastAPI(
        title="GPU Timekeeper",
        version="1",
        summary="Per-namespace GPU-minute budgets, the usage ledger and the admission snapshot.",
        lifespan=lifespan,
        # Its OpenTelemetry hooks would ask the environment for a tracer on every request; the
        # timekeeper's metrics are Prometheus' (timekeeper/metrics.py).
        telemetry={"tracing": False, "metrics": False, "logs": False},
        # /docs is mount_docs' page on files in the image; FastAPI's pages load scripts from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    install_error_handler(app)
    # Included one level deep under the prefix (POST /reports first: the hottest path): each level of
    # nested routers costs every request a walk through it.
    routers = (
        usage_router,
        budgets_router,
        pools_router,
        audit_router,
        snapshot_router,
        billing_router,
        billing_namespaced_router,
        auth_router,
    )
    for router in routers:
        app.include_router(router, prefix=API_PREFIX, responses=API_ERRORS)
    app.include_router(health_router, prefix=API_PREFIX)
    # Probes and scrapers expect these at the root as well.
    app.include_router(health_router, include_in_schema=False)
    mount_docs(app)
    if settings.ui_enabled:
        mount_ui(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, render=_too_large)
    return app
