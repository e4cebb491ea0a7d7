"""Budget status for readers; budgets, defaults and grants for admins."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from timekeeper.auth.dependencies import Admin, Reader, ReadScope
from timekeeper.budgets.schemas import BudgetConfigOut, BudgetIn, GrantIn, GrantOut, NamespaceBudgetOut
from timekeeper.budgets.service import BudgetService
from timekeeper.db.session import SessionDep
from timekeeper.routing import StrictJsonRoute
from timekeeper.schemas import BODY_ERRORS, NamespacePath, error_responses

router = APIRouter(tags=["budgets"], route_class=StrictJsonRoute)


def _service(request: Request, session: SessionDep) -> BudgetService:
    return BudgetService(session, request.app.state.settings, request.app.state.clock)


Service = Annotated[BudgetService, Depends(_service)]


@router.get("/namespaces", response_model=list[NamespaceBudgetOut])
async def list_namespaces(service: Service, scope: ReadScope) -> list[NamespaceBudgetOut]:
    """Every known namespace; for a credential scoped to namespaces, exactly those."""
    return await service.all() if scope is None else await service.some(sorted(scope))


@router.get("/namespaces/{namespace}/budget", response_model=NamespaceBudgetOut)
async def get_budget(namespace: NamespacePath, service: Service, _: Reader) -> NamespaceBudgetOut:
    return await service.status(namespace)


@router.put("/namespaces/{namespace}/budget", response_model=NamespaceBudgetOut, responses=BODY_ERRORS)
async def put_budget(
    namespace: NamespacePath, body: BudgetIn, service: Service, admin: Admin
) -> NamespaceBudgetOut:
    return await service.put(namespace, body, admin)


@router.delete(
    "/namespaces/{namespace}/budget", response_model=NamespaceBudgetOut, responses=error_responses(404)
)
async def delete_budget(namespace: NamespacePath, service: Service, admin: Admin) -> NamespaceBudgetOut:
    return await service.delete(namespace, admin)


@router.get("/defaults", response_model=BudgetConfigOut)
async def get_defaults(service: Service, _: Admin) -> BudgetConfigOut:
    return await service.default()


@router.put("/defaults", response_model=BudgetConfigOut, responses=BODY_ERRORS)
async def put_defaults(body: BudgetIn, service: Service, admin: Admin) -> BudgetConfigOut:
    return await service.put_default(body, admin)


@router.post(
    "/namespaces/{namespace}/grants", response_model=GrantOut, status_code=201, responses=BODY_ERRORS
)
async def create_grant(namespace: NamespacePath, body: GrantIn, service: Service, admin: Admin) -> GrantOut:
    return await service.grant(namespace, body, admin)
