"""Billing weights per GPU model, prices per GPU-hour and the charge basis: read by readers, set by admins."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse

from gpuaccounting.names import DNS_LABEL
from timekeeper.auth.dependencies import Admin, NamespaceKey, Reader, ReadScope
from timekeeper.billing.chargeback import (
    BucketKind,
    ChargebackExports,
    ExportFormat,
    as_csv,
    as_json,
    chargeback_range,
)
from timekeeper.billing.schemas import (
    ChargeBasisIn,
    ChargeBasisOut,
    ModelPath,
    PriceIn,
    PriceOut,
    WeightIn,
    WeightOut,
    WeightsOut,
)
from timekeeper.billing.service import BillingService
from timekeeper.context import ContextDep, Slot
from timekeeper.db.session import SessionDep
from timekeeper.domain.periods import PeriodKind, period_containing
from timekeeper.routing import StrictRoute
from timekeeper.schemas import BODY_ERRORS, Timestamp, error_responses

router = APIRouter(prefix="/billing", tags=["billing"], route_class=StrictRoute)
namespaced = APIRouter(tags=["billing"], route_class=StrictRoute)
# The context's slot this domain owns (timekeeper/context.py).
CHARGEBACK_EXPORTS: Slot[ChargebackExports] = Slot("chargeback_exports")


async def _service(context: ContextDep, session: SessionDep) -> BillingService:
    return BillingService(session, context.settings, context.clock)


BillingServiceDep = Annotated[BillingService, Depends(_service)]


@router.get("/weights", response_model=WeightsOut)
async def list_weights(service: BillingServiceDep, _: Reader) -> WeightsOut:
    """The weights in force (a GPU model not listed counts 1) and the changes set for later."""
    return await service.weights()


@router.put("/weights/{model}", response_model=WeightOut, responses=BODY_ERRORS)
async def put_weight(model: ModelPath, body: WeightIn, service: BillingServiceDep, admin: Admin) -> WeightOut:
    """A GPU-minute on `model` counts `weight` from `effective_from` on; earlier time keeps its weight."""
    return await service.set_weight(model, body, admin)


@router.delete("/weights/{model}", response_model=WeightOut, responses=error_responses(404))
async def reset_weight(model: ModelPath, service: BillingServiceDep, admin: Admin) -> WeightOut:
    return await service.reset_weight(model, admin)


@router.get("/prices", response_model=list[PriceOut])
async def list_prices(service: BillingServiceDep, _: Reader) -> list[PriceOut]:
    return await service.prices()


@router.put("/prices/{model}", response_model=PriceOut, responses=BODY_ERRORS)
async def put_price(model: ModelPath, body: PriceIn, service: BillingServiceDep, admin: Admin) -> PriceOut:
    return await service.set_price(model, body, admin)


@router.delete("/prices/{model}", status_code=204, responses=error_responses(404))
async def delete_price(model: ModelPath, service: BillingServiceDep, admin: Admin) -> Response:
    await service.delete_price(model, admin)
    return Response(status_code=204)


@router.get("/charge-basis", response_model=ChargeBasisOut)
async def get_cluster_basis(service: BillingServiceDep, _: Reader) -> ChargeBasisOut:
    return await service.basis(None)


@router.put("/charge-basis", response_model=ChargeBasisOut, responses=BODY_ERRORS)
async def put_cluster_basis(body: ChargeBasisIn, service: BillingServiceDep, admin: Admin) -> ChargeBasisOut:
    return await service.set_basis(None, body, admin)


@router.delete("/charge-basis", response_model=ChargeBasisOut, responses=error_responses(404))
async def delete_cluster_basis(service: BillingServiceDep, admin: Admin) -> ChargeBasisOut:
    return await service.delete_basis(None, admin)


_CSV = "text/csv"
# One cluster of the export: a member's name, or empty for the local cluster (the name its rows carry,
# LOCAL_CLUSTER_LABEL, which no member's name can be). A name no member has any more is not refused: its
# use stays in the ledger, to be billed.
ClusterQuery = Annotated[
    str | None,
    Query(
        max_length=63,
        pattern=f"^$|{DNS_LABEL}",
        description="one cluster's rows: a member cluster's name, or empty for the local cluster",
    ),
]


@router.get(
    "/chargeback",
    responses={
        200: {
            "description": "rows per period, cluster, namespace and GPU model (JSON, then the totals; "
            "or CSV with a header row)",
            "content": {"application/json": {}, _CSV: {"schema": {"type": "string"}}},
        },
        **error_responses(429, 503),
    },
    response_class=StreamingResponse,
)
async def export_chargeback(
    request: Request,
    context: ContextDep,
    scope: ReadScope,
    since: Timestamp | None = None,
    until: Timestamp | None = None,
    period: BucketKind = "monthly",
    export_format: Annotated[ExportFormat | None, Query(alias="format")] = None,
    cluster: ClusterQuery = None,
) -> StreamingResponse:
    """Per period (clipped to [since, until); default: this month so far), cluster, namespace and GPU
    model: raw and charged GPU-minutes, mean utilisation, price and cost; in JSON, then each cluster's
    totals and those of all. `?format=csv` or `Accept: text/csv` for CSV. Each row equals the usage API's
    answer by model for that namespace and period. `cluster` keeps one cluster's rows (`cluster=`: the
    local cluster's)."""
    settings, now = context.settings, context.clock.now()
    span = chargeback_range(period, since or period_containing(PeriodKind(period), now).start, until or now)
    namespaces = None if scope is None else sorted(scope)
    rows = await context[CHARGEBACK_EXPORTS].rows(span, namespaces, settings.billing_currency, cluster)
    wanted = export_format or ("csv" if _CSV in request.headers.get("accept", "") else "json")
    if wanted == "csv":
        return StreamingResponse(
            as_csv(rows),
            media_type=f"{_CSV}; charset=utf-8",
            headers={"Content-Disposition": 'attachment; filename="chargeback.csv"'},
        )
    return StreamingResponse(as_json(span, settings.billing_currency, rows), media_type="application/json")


@namespaced.get("/namespaces/{namespace}/charge-basis", response_model=ChargeBasisOut)
async def get_basis(namespace: NamespaceKey, service: BillingServiceDep, _: Reader) -> ChargeBasisOut:
    return await service.basis(namespace)


@namespaced.put("/namespaces/{namespace}/charge-basis", response_model=ChargeBasisOut, responses=BODY_ERRORS)
async def put_basis(
    namespace: NamespaceKey,
    body: ChargeBasisIn,
    service: BillingServiceDep,
    admin: Admin,
) -> ChargeBasisOut:
    return await service.set_basis(namespace, body, admin)


@namespaced.delete(
    "/namespaces/{namespace}/charge-basis", response_model=ChargeBasisOut, responses=error_responses(404)
)
async def delete_basis(namespace: NamespaceKey, service: BillingServiceDep, admin: Admin) -> ChargeBasisOut:
    """The namespace follows the cluster's basis again."""
    return await service.delete_basis(namespace, admin)
