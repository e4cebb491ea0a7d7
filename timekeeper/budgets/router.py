"""Budget status for readers; budgets, defaults and grants for admins."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import TypeAdapter
from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.auth.dependencies import Admin, NamespaceKey, Reader, ReadScope
from timekeeper.budgets.schemas import (
    BudgetConfigOut,
    BudgetIn,
    GrantEntryOut,
    GrantIn,
    GrantOut,
    NamespaceBudgetOut,
)
from timekeeper.budgets.service import BudgetReads, BudgetService
from timekeeper.context import ContextDep, context_of
from timekeeper.db.session import ReadsDep, SessionDep, read
from timekeeper.routing import StrictRoute
from timekeeper.schemas import BODY_ERRORS, error_responses

router = APIRouter(tags=["budgets"], route_class=StrictRoute)


async def _service(context: ContextDep, session: SessionDep) -> BudgetService:
    return BudgetService(session, context.settings, context.clock)


BudgetServiceDep = Annotated[BudgetService, Depends(_service)]
BIGINT_MAX = 2**63 - 1  # ids are bigints
# The reads answer the status they read, encoded once (not validated again as the response model).
_STATUSES = TypeAdapter(list[NamespaceBudgetOut])


@router.get("/namespaces", response_model=list[NamespaceBudgetOut])
async def list_namespaces(context: ContextDep, reads: ReadsDep, scope: ReadScope) -> Response:
    """Every known namespace; for a credential scoped to namespaces, exactly those."""

    async def statuses_of(session: AsyncSession) -> list[NamespaceBudgetOut]:
        budgets = BudgetReads(session, context.settings, context.clock)
        return await budgets.all() if scope is None else await budgets.some(sorted(scope))

    statuses = await reads(statuses_of)
    return Response(_STATUSES.dump_json(statuses), media_type="application/json")


# The most frequent read: it reaches the context and its read sessions itself, not through ContextDep and
# ReadsDep, two dependencies fewer for FastAPI to solve (docs/performance.md, "Reads").
@router.get("/namespaces/{namespace}/budget", response_model=NamespaceBudgetOut)
async def get_budget(request: Request, namespace: NamespaceKey, _: Reader) -> Response:
    """One namespace's budget status (any namespace has one: an unknown one is on the default, unused)."""
    context = context_of(request)
    status = await read(
        context.reads, lambda session: BudgetReads(session, context.settings, context.clock).status(namespace)
    )
    return Response(status.model_dump_json(), media_type="application/json")


@router.put(
    "/namespaces/{namespace}/budget",
    response_model=NamespaceBudgetOut,
    responses={**BODY_ERRORS, **error_responses(409)},
)
async def put_budget(
    namespace: NamespaceKey,
    body: BudgetIn,
    service: BudgetServiceDep,
    admin: Admin,
) -> NamespaceBudgetOut:
    await service.refuse_if_managed(namespace)
    return await service.put(namespace, body, admin)


@router.delete(
    "/namespaces/{namespace}/budget", response_model=NamespaceBudgetOut, responses=error_responses(404, 409)
)
async def delete_budget(
    namespace: NamespaceKey, service: BudgetServiceDep, admin: Admin
) -> NamespaceBudgetOut:
    await service.refuse_if_managed(namespace)
    return await service.delete(namespace, admin)


@router.get("/defaults", response_model=BudgetConfigOut)
async def get_defaults(service: BudgetServiceDep, _: Admin) -> BudgetConfigOut:
    return await service.default()


@router.put("/defaults", response_model=BudgetConfigOut, responses={**BODY_ERRORS, **error_responses(409)})
async def put_defaults(body: BudgetIn, service: BudgetServiceDep, admin: Admin) -> BudgetConfigOut:
    await service.refuse_if_managed(None)
    return await service.put_default(body, admin)


@router.post(
    "/namespaces/{namespace}/grants", response_model=GrantOut, status_code=201, responses=BODY_ERRORS
)
async def create_grant(
    namespace: NamespaceKey, body: GrantIn, service: BudgetServiceDep, admin: Admin
) -> GrantOut:
    return await service.grant(namespace, body, admin)


@router.get("/namespaces/{namespace}/grants", response_model=list[GrantEntryOut])
async def list_grants(
    namespace: NamespaceKey,
    service: BudgetServiceDep,
    _: Reader,
    before_id: Annotated[int | None, Query(ge=1, le=BIGINT_MAX)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[GrantEntryOut]:
    """Newest first, every status (active, expired, revoked, lapsed); page with before_id."""
    return await service.grants(namespace, limit, before_id)


@router.delete(
    "/namespaces/{namespace}/grants/{grant_id}", response_model=GrantOut, responses=error_responses(404)
)
async def revoke_grant(
    namespace: NamespaceKey,
    grant_id: Annotated[int, Path(ge=1, le=BIGINT_MAX)],
    service: BudgetServiceDep,
    admin: Admin,
) -> GrantOut:
    """The grant stops counting from now. Revoking it again answers it unchanged."""
    return await service.revoke(namespace, grant_id, admin)
