"""Liveness, readiness (the database answers) and the Prometheus scrape."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from timekeeper.auth.base import Action
from timekeeper.auth.dependencies import MetricsAccess, authenticated, has_credentials
from timekeeper.billing.repository import BillingRepository
from timekeeper.budgets.service import BudgetService
from timekeeper.db.session import SessionDep
from timekeeper.errors import TimekeeperError
from timekeeper.metrics import Metrics, NamespaceRow
from timekeeper.pools.service import PoolService
from timekeeper.schemas import error_responses
from timekeeper.usage.efficiency import EfficiencyService

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses=error_responses(401, 503))
async def readyz(request: Request) -> dict[str, Any]:
    """Ready when the database answers; the replica's name and its jobs only for a cluster-wide reader
    (they name the host and process, which an anonymous prober has no need to learn)."""
    # No credentials: an anonymous prober (the kubelet); a token not accepted is 401, as anywhere.
    principal = await authenticated(request) if has_credentials(request) else None
    try:
        async with request.app.state.sessionmaker() as session:
            await session.execute(sa.text("SELECT 1"))
    except (sa.exc.SQLAlchemyError, OSError) as error:
        raise TimekeeperError(f"database unreachable: {type(error).__name__}", 503) from error
    scheduler = getattr(request.app.state, "scheduler", None)
    if (
        scheduler is None
        or principal is None
        or not await request.app.state.access.authorize(principal, Action.READ, None)
    ):
        return {"status": "ready"}
    # Job health is shown, not judged: a failing job must not take the replica out of service.
    return {"status": "ready", "scheduler": scheduler.status()}


@router.get(
    "/metrics", response_class=Response, dependencies=[MetricsAccess], responses=error_responses(401, 403)
)
async def metrics(request: Request, session: SessionDep) -> Response:
    registry: Metrics = request.app.state.metrics
    now = request.app.state.clock.now()
    statuses = await BudgetService(session, request.app.state.settings, request.app.state.clock).all()
    registry.namespaces.rows = [
        NamespaceRow(
            namespace=status.namespace,
            budget=None
            if status.budget_gpu_minutes is None
            else float(status.budget_gpu_minutes + status.granted_gpu_minutes),
            used=float(status.used_gpu_minutes),
            remaining=None if status.remaining_gpu_minutes is None else float(status.remaining_gpu_minutes),
            state=status.state,
            burn_rate=float(status.forecast.burn_rate_gpu_minutes_per_hour),
            exhaustion_seconds=None
            if status.forecast.exhausts_at is None
            else max(0.0, (status.forecast.exhausts_at - now).total_seconds()),
        )
        for status in statuses
    ]
    idle: dict[str, tuple[int, float]] = {}
    report = await EfficiencyService(session, request.app.state.settings, request.app.state.clock).idle(None)
    for pod in report.pods:
        count, shares = idle.get(pod.namespace, (0, 0.0))
        idle[pod.namespace] = (count + 1, shares + float(pod.gpu_share))
    registry.idle.rows = [(namespace, count, shares) for namespace, (count, shares) in sorted(idle.items())]
    registry.unweighted_pods.clear()
    for namespace, count in (await BillingRepository(session).running_pods_without_model()).items():
        registry.unweighted_pods.labels(namespace=namespace).set(count)
    pools = await PoolService(session, request.app.state.settings, request.app.state.clock).pools()
    registry.pools.rows = [
        (
            pool.name,
            float(pool.budget_gpu_minutes + pool.granted_gpu_minutes),
            float(pool.used_gpu_minutes),
            pool.state,
        )
        for pool in pools
    ]
    return Response(generate_latest(registry.registry), media_type=CONTENT_TYPE_LATEST)
