"""POST /reports (sidecars) and GET /namespaces/{ns}/usage (readers)."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request, Response
from fastapi.routing import APIRoute
from pydantic import AwareDatetime, ValidationError
from starlette.exceptions import HTTPException

from timekeeper.auth.base import Action
from timekeeper.auth.dependencies import (
    AuthenticatedPrincipal,
    Reader,
    authorize,
    bearer_principal,
    check_pod_identity,
)
from timekeeper.db.session import SessionDep
from timekeeper.metrics import Metrics
from timekeeper.routing import StrictJsonRequest, StrictJsonRoute
from timekeeper.schemas import BODY_ERRORS, NamespacePath, error_responses
from timekeeper.usage.repository import GroupBy
from timekeeper.usage.schemas import ReportAck, ReportIn, UsageOut
from timekeeper.usage.service import UsageService, ingest_report

router = APIRouter(tags=["usage"], route_class=StrictJsonRoute)


async def _well_formed_report(request: Request) -> ReportIn | None:
    """The report, when the body is JSON that validates exactly as FastAPI would validate it (orjson, then
    pydantic in python mode); None for anything else, which FastAPI's own handler then answers."""
    content_type = request.headers.get("content-type", "")
    if content_type.partition(";")[0].strip().lower() != "application/json":
        return None
    try:
        body = await request.body()
    except HTTPException:  # the body size limit: answered as it is on FastAPI's path
        raise
    except Exception:  # e.g. the client went away: FastAPI's handler answers it as it always does
        return None
    try:
        return ReportIn.model_validate(orjson.loads(body))
    except (orjson.JSONDecodeError, ValidationError):
        return None


class ReportRoute(APIRoute):
    """The hot path, POST /reports. FastAPI's per-request dependency resolution and body handling cost
    about as much CPU as the rest of the ASGI stack (docs/performance.md); a well-formed report skips it:
    the endpoint is called with the report and the bearer token's principal directly. Everything else
    (malformed bodies, other content types) goes through FastAPI's handler with the body already read, so
    every refusal is FastAPI's own and the route stays documented in the OpenAPI as declared."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        endpoint = self.endpoint

        async def lean(request: Request) -> Response:
            request = StrictJsonRequest(request.scope, request.receive)
            report = await _well_formed_report(request)
            if report is None:
                return await handler(request)
            response: Response = await endpoint(request, report, await bearer_principal(request))
            return response

        return lean


async def post_report(request: Request, report: ReportIn, principal: AuthenticatedPrincipal) -> Response:
    """Charge one interval of a pod's GPU use. A retry of the same (pod_uid, seq, interval) answers
    `duplicate: true` and charges nothing; time already charged is never charged again. Answered after
    the commit that made the charge durable."""
    started = time.perf_counter()
    await authorize(request, principal, Action.REPORT, report.namespace)
    check_pod_identity(principal, report.namespace, report.pod, report.pod_uid)
    state = request.app.state
    outcome = await ingest_report(state.ingest, state.settings, state.clock, report)
    metrics: Metrics = state.metrics
    metrics.reports.labels(result="duplicate" if outcome.duplicate else "charged").inc()
    metrics.ingest_seconds.observe(time.perf_counter() - started)
    # The hot path: encoded directly (response_model still documents it), same JSON as ReportAck's.
    body = {"duplicate": outcome.duplicate, "gpu_minutes": float(outcome.gpu_minutes), "state": outcome.state}
    return Response(orjson.dumps(body), media_type="application/json")


router.add_api_route(
    "/reports",
    post_report,
    methods=["POST"],
    response_model=ReportAck,
    responses=BODY_ERRORS | error_responses(409),
    route_class_override=ReportRoute,
)


@router.get("/namespaces/{namespace}/usage", response_model=UsageOut)
async def get_usage(
    request: Request,
    namespace: NamespacePath,
    session: SessionDep,
    _: Reader,
    since: AwareDatetime | None = None,
    until: AwareDatetime | None = None,
    group_by: Annotated[GroupBy, Query()] = "pod",
) -> UsageOut:
    service = UsageService(session, request.app.state.settings, request.app.state.clock)
    return await service.usage(namespace, since, until, group_by)
