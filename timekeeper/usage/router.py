"""POST /reports (sidecars) and GET /namespaces/{ns}/usage (readers)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from pydantic import AwareDatetime
from pydantic.json_schema import models_json_schema

from gpuaccounting.names import REPORTS_PATH
from timekeeper.auth.base import Action, Principal
from timekeeper.auth.dependencies import Reader, ReadScope, authenticated, authorize, check_pod_identity
from timekeeper.db.session import SessionDep
from timekeeper.metrics import Metrics
from timekeeper.routing import RequestRoute, StrictJsonRoute, json_body
from timekeeper.schemas import API_ERRORS, BODY_ERRORS, NamespacePath, error_responses
from timekeeper.usage.efficiency import EfficiencyService
from timekeeper.usage.repository import GroupBy
from timekeeper.usage.schemas import EfficiencyOut, IdleReportOut, ReportAck, ReportIn, UsageOut
from timekeeper.usage.service import AdmittedShareUnknown, IngestOutcome, UsageService, check_report

if TYPE_CHECKING:
    from timekeeper.usage.admitted import PodShares

router = APIRouter(tags=["usage"], route_class=StrictJsonRoute)

# POST /reports reads its body itself (below); these are the body's schemas for the OpenAPI components.
REPORT_SCHEMAS: dict[str, Any] = models_json_schema(
    [(ReportIn, "validation")], ref_template="#/components/schemas/{model}"
)[1]["$defs"]


async def charge_report(request: Request, principal: Principal, report: ReportIn) -> IngestOutcome:
    """The report charged in its batch. A pod whose admitted share the pods table does not hold yet (its
    first report, in Kubernetes auth mode) has it read from the pod, off the batch, and the report
    submitted again with it: the pods table keeps it, so later reports cost no read."""
    state = request.app.state
    try:
        return await state.ingest.submit(report)
    except AdmittedShareUnknown:
        shares: PodShares | None = state.pod_shares
        if shares is None or principal.pod is None:
            raise
        return await state.ingest.submit(report, await shares.admitted(principal.pod))


async def post_report(request: Request) -> Response:
    """Charge one interval of a pod's GPU use, at the GPU share the pod was admitted at (the report's
    `gpu_share` only where none is known: static auth mode). A retry of the same (pod_uid, seq,
    interval) answers `duplicate: true` and charges nothing; time already charged is never charged
    again. Answered after the commit that made the charge durable.

    The endpoint authenticates before it reads the body (no token is a 401 whatever the body), then
    validates the body itself: FastAPI would parse a declared body before any dependency runs."""
    started = time.perf_counter()
    principal = await authenticated(request)
    report = await json_body(request, ReportIn)
    await authorize(request, principal, Action.REPORT, report.namespace)
    check_pod_identity(principal, report.namespace, report.pod, report.pod_uid)
    state = request.app.state
    check_report(state.settings, report, state.clock.now())
    outcome = await charge_report(request, principal, report)
    metrics: Metrics = state.metrics
    metrics.reports.labels(result="duplicate" if outcome.duplicate else "charged").inc()
    if outcome.share_differs:
        metrics.share_mismatches.inc()
    metrics.ingest_seconds.observe(time.perf_counter() - started)
    ack = ReportAck(duplicate=outcome.duplicate, gpu_minutes=outcome.gpu_minutes, state=outcome.state)
    return Response(ack.model_dump_json(), media_type="application/json")


def add_report_route(app: FastAPI) -> None:
    """POST /reports on the app's own router, ahead of every included router: the hottest path, and
    FastAPI matches an included router's routes through layers that cost it about a tenth of its CPU
    (docs/performance.md)."""
    app.router.add_api_route(
        REPORTS_PATH,
        post_report,
        methods=["POST"],
        tags=["usage"],
        response_model=ReportAck,
        responses=API_ERRORS | BODY_ERRORS | error_responses(409, 503),
        route_class_override=RequestRoute,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ReportIn"}}},
            }
        },
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


def _efficiency(request: Request, session: SessionDep) -> EfficiencyService:
    return EfficiencyService(session, request.app.state.settings, request.app.state.clock)


Efficiency = Annotated[EfficiencyService, Depends(_efficiency)]


@router.get("/namespaces/{namespace}/efficiency", response_model=EfficiencyOut)
async def get_efficiency(
    namespace: NamespacePath,
    service: Efficiency,
    _: Reader,
    since: AwareDatetime | None = None,
    until: AwareDatetime | None = None,
) -> EfficiencyOut:
    """Allocated beside utilised GPU-minutes, per pod and for the namespace, over [since, until)
    (default: the current period until now)."""
    return await service.efficiency(namespace, since, until)


@router.get("/idle-pods", response_model=IdleReportOut)
async def get_idle_pods(service: Efficiency, scope: ReadScope) -> IdleReportOut:
    """Running pods holding GPUs they barely use (settings idle_after, idle_below_sm_util_pct); for a
    credential scoped to namespaces, only theirs."""
    return await service.idle(None if scope is None else sorted(scope))
