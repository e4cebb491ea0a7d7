"""Liveness, readiness (the database answers) and the Prometheus scrape."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import sqlalchemy as sa
from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from timekeeper.auth.base import Action
from timekeeper.auth.dependencies import ACCESS, ANONYMOUS, AuthenticatedPrincipal, MetricsAccess
from timekeeper.context import ContextDep
from timekeeper.db.outage import is_outage
from timekeeper.db.session import ReadsDep
from timekeeper.errors import TimekeeperError
from timekeeper.health.readout import read_budget_readout
from timekeeper.metrics import METRICS
from timekeeper.schemas import error_responses

router = APIRouter(tags=["health"])
log = logging.getLogger(__name__)
# Below Prometheus' default scrape timeout (10 s): a slow database leaves the last figures, not a failure.
READ_TIMEOUT_SECONDS = 5.0


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses=error_responses(400, 401, 503))
async def readyz(context: ContextDep, reads: ReadsDep, principal: AuthenticatedPrincipal) -> dict[str, Any]:
    """Ready when the database answers; the replica's name and its jobs only for a cluster-wide reader
    (they name the host and process, which an anonymous prober has no need to learn)."""
    # No credentials: an anonymous prober (the kubelet); a token not accepted is 401, as anywhere.
    try:
        await reads(lambda session: session.execute(sa.text("SELECT 1")))
    except (sa.exc.SQLAlchemyError, OSError) as error:
        raise TimekeeperError(f"database unreachable: {type(error).__name__}", 503) from error
    scheduler = context.scheduler
    if (
        scheduler is None
        or principal is ANONYMOUS
        or principal.cluster is not None  # a member's reader: the hub's replicas are not its cluster's
        or not await context[ACCESS].authorize(principal, Action.READ, None)
    ):
        return {"status": "ready"}
    # Job health is shown, not judged: a failing job must not take the replica out of service.
    return {"status": "ready", "scheduler": scheduler.status()}


@router.get(
    "/metrics",
    response_class=Response,
    dependencies=[MetricsAccess],
    responses=error_responses(400, 401, 403),
)
async def metrics(context: ContextDep, reads: ReadsDep) -> Response:
    """Always answers: while the database does not (an outage, or a read slower than the scrape can
    wait), the budgets are those of the last read, `timekeeper_budget_metrics_age_seconds` says how old,
    and `timekeeper_database_up` is 0 (db/outage.py)."""
    registry = context[METRICS]
    try:
        async with asyncio.timeout(READ_TIMEOUT_SECONDS):
            readout = await reads(
                lambda session: read_budget_readout(session, context.settings, context.clock)
            )
    except (sa.exc.SQLAlchemyError, OSError, TimeoutError) as error:
        if isinstance(error, sa.exc.SQLAlchemyError) and not is_outage(error):
            raise  # a bug: the server's 500, with its traceback logged
        log.warning("metrics_read_failed", extra={"error": repr(error)[:300]})
    else:
        registry.show(readout)
    return Response(generate_latest(registry.registry), media_type=CONTENT_TYPE_LATEST)
