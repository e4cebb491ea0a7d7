"""POST /reports (sidecars) and GET /namespaces/{ns}/usage (readers)."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from gpuaccounting.names import API_PREFIX, REPORTS_PATH
from timekeeper.auth.base import Action, Principal
from timekeeper.auth.dependencies import (
    AuthenticatedPrincipal,
    NamespaceKey,
    Reader,
    ReadScope,
    authorize,
    check_pod_identity,
)
from timekeeper.context import Context, ContextDep, Slot, context_of
from timekeeper.db.session import SessionDep
from timekeeper.domain.clusters import namespace_key, pod_key
from timekeeper.domain.measurements import GroupBy
from timekeeper.metrics import METRICS
from timekeeper.refusals import REFUSALS
from timekeeper.routing import StrictRoute
from timekeeper.schemas import BODY_ERRORS, Timestamp, error_responses
from timekeeper.usage.batcher import IngestBatcher
from timekeeper.usage.efficiency import EfficiencyService
from timekeeper.usage.schemas import EfficiencyOut, IdleReportOut, ReportAck, ReportIn, UsageOut
from timekeeper.usage.service import AdmittedShareUnknown, IngestOutcome, UsageService, check_report

if TYPE_CHECKING:
    from timekeeper.usage.admitted import PodShares

router = APIRouter(tags=["usage"], route_class=StrictRoute)
# The context's slots this domain owns (timekeeper/context.py): the batcher, and the pods' admitted
# shares read from Kubernetes, one reader per cluster (None: the local one; the slot holds None unless
# settings.admitted_share_from_pod).
INGEST: Slot[IngestBatcher] = Slot("ingest")
POD_SHARES: Slot[Mapping[str | None, PodShares] | None] = Slot("pod_shares")


async def _service(context: ContextDep, session: SessionDep) -> UsageService:
    return UsageService(session, context.settings, context.clock)


UsageServiceDep = Annotated[UsageService, Depends(_service)]


class ReportRoute(StrictRoute):
    """POST /reports' route: counts a refused report, whatever refused it (authentication, authorization,
    validation, limits, an outage), and times an accepted one, around FastAPI's whole handling of it. As
    a dependency it cost FastAPI's machinery for a dependency with yield on every report
    (docs/performance.md, "What a report costs")."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def observed(request: Request) -> Response:
            metrics = context_of(request)[METRICS]
            started = time.perf_counter()
            try:
                response = await handle(request)
            except REFUSALS:
                metrics.reports.labels(result="rejected").inc()
                raise
            metrics.ingest_seconds.observe(time.perf_counter() - started)
            return response

        return observed


async def charge_report(context: Context, principal: Principal, report: ReportIn) -> IngestOutcome:
    """The report charged in its batch. A pod whose admitted share the pods table does not hold yet (its
    first report, in Kubernetes auth mode) has it read from the pod, off the batch, and the report
    submitted again with it: the pods table keeps it, so later reports cost no read. The pod is read
    from the API server of the principal's cluster, which bound its token to it."""
    ingest = context[INGEST]
    try:
        return await ingest.submit(report)
    except AdmittedShareUnknown:
        readers = context[POD_SHARES]
        shares = None if readers is None else readers.get(principal.cluster)
        if shares is None or principal.pod is None:
            raise
        return await ingest.submit(report, await shares.admitted(principal.pod))


def keyed(cluster: str | None, report: ReportIn) -> ReportIn:
    """A report of `cluster`'s sender under the keys its namespace and pod are stored under
    (timekeeper/domain/clusters.py), so the uid a member's API server bound the token to never names,
    touches or blocks another cluster's pod; the local cluster's report as it is."""
    if cluster is None:
        return report
    keys = {
        "namespace": namespace_key(cluster, report.namespace),
        "pod_uid": pod_key(cluster, report.pod_uid),
    }
    return report.model_copy(update=keys)


async def post_report(request: Request, sender: AuthenticatedPrincipal, report: ReportIn) -> Response:
    """Charge one interval of a pod's GPU use, at the GPU share the pod was admitted at (the report's
    `gpu_share` only where none is known: static auth mode). A retry of the same (pod_uid, seq,
    interval) answers `duplicate: true` and charges nothing; time already charged is never charged
    again. Answered after the commit that made the charge durable. The sender is authenticated before
    the body is validated (401 before any 422; StrictRoute refuses a caller with no credential first),
    then authorized for the report's namespace and, for a credential bound to a pod, that pod (403). A
    member cluster's sender reports its cluster's pods, charged under their namespace and pod keys
    (timekeeper/domain/clusters.py, docs/fleet.md)."""
    context = context_of(request)
    key = namespace_key(sender.cluster, report.namespace)
    await authorize(context, sender, Action.REPORT, key)
    check_pod_identity(sender, report.namespace, report.pod, report.pod_uid)
    check_report(context.settings, report, context.clock.now())
    outcome = await charge_report(context, sender, keyed(sender.cluster, report))
    metrics = context[METRICS]
    metrics.reports.labels(result="duplicate" if outcome.duplicate else "charged").inc()
    if outcome.share_differs:
        metrics.share_mismatches.inc()
    ack = ReportAck(duplicate=outcome.duplicate, gpu_minutes=outcome.gpu_minutes, state=outcome.state)
    return Response(ack.model_dump_json(), media_type="application/json")


router.add_api_route(
    REPORTS_PATH.removeprefix(API_PREFIX),
    post_report,
    methods=["POST"],
    response_model=ReportAck,
    responses=BODY_ERRORS | error_responses(409, 503),
    route_class_override=ReportRoute,
)


@router.get("/namespaces/{namespace}/usage", response_model=UsageOut)
async def get_usage(
    namespace: NamespaceKey,
    service: UsageServiceDep,
    _: Reader,
    since: Timestamp | None = None,
    until: Timestamp | None = None,
    group_by: Annotated[GroupBy, Query()] = "pod",
) -> UsageOut:
    return await service.usage(namespace, since, until, group_by)


async def _efficiency(context: ContextDep, session: SessionDep) -> EfficiencyService:
    return EfficiencyService(session, context.settings, context.clock)


EfficiencyServiceDep = Annotated[EfficiencyService, Depends(_efficiency)]


@router.get("/namespaces/{namespace}/efficiency", response_model=EfficiencyOut)
async def get_efficiency(
    namespace: NamespaceKey,
    service: EfficiencyServiceDep,
    _: Reader,
    since: Timestamp | None = None,
    until: Timestamp | None = None,
) -> EfficiencyOut:
    """Allocated beside utilised GPU-minutes, per pod and for the namespace, over [since, until)
    (default: the current period until now)."""
    return await service.efficiency(namespace, since, until)


@router.get("/idle-pods", response_model=IdleReportOut)
async def get_idle_pods(service: EfficiencyServiceDep, scope: ReadScope) -> IdleReportOut:
    """Running pods holding GPUs they barely use (settings idle_after, idle_below_sm_util_pct); for a
    credential scoped to namespaces, only theirs."""
    return await service.idle(None if scope is None else sorted(scope))
