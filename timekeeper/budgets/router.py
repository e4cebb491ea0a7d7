"""Budget status for readers; budgets, defaults and grants for admins."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import TypeAdapter

from timekeeper.auth.base import Action
from timekeeper.auth.dependencies import Admin, Reader, permitted, read_scope
from timekeeper.budgets.schemas import (
    BudgetConfigOut,
    BudgetIn,
    GrantEntryOut,
    GrantIn,
    GrantOut,
    NamespaceBudgetOut,
)
from timekeeper.budgets.service import BudgetReads, BudgetService
from timekeeper.db.session import SessionDep
from timekeeper.gitops.guard import refuse_if_managed
from timekeeper.routing import (
    BEARER,
    NAMESPACE,
    NAMESPACE_PARAMETER,
    RequestRoute,
    StrictJsonRoute,
    path_param,
)
from timekeeper.schemas import BODY_ERRORS, NamespacePath, error_responses

router = APIRouter(tags=["budgets"], route_class=StrictJsonRoute)


def _service(request: Request, session: SessionDep) -> BudgetService:
    return BudgetService(session, request.app.state.settings, request.app.state.clock)


Service = Annotated[BudgetService, Depends(_service)]
BIGINT_MAX = 2**63 - 1  # ids are bigints


async def list_namespaces(request: Request) -> Response:
    """Every known namespace; for a credential scoped to namespaces, exactly those."""
    scope = await read_scope(request)
    state = request.app.state
    async with state.reads.reading(state.read_sessionmaker) as reading:
        reads = BudgetReads(reading, state.settings, state.clock)
        statuses = await reads.all() if scope is None else await reads.some(sorted(scope))
    return Response(_STATUSES.dump_json(statuses), media_type="application/json")


async def get_budget(request: Request) -> Response:
    """One namespace's budget status (any namespace has one: an unknown one is on the default, unused)."""
    await permitted(request, Action.READ, request.path_params["namespace"])
    namespace = path_param(request, "namespace", NAMESPACE)
    state = request.app.state
    async with state.reads.reading(state.read_sessionmaker) as reading:
        status = await BudgetReads(reading, state.settings, state.clock).status(namespace)
    return Response(status.model_dump_json(), media_type="application/json")


# The API's hottest GETs take the Request alone (RequestRoute): they authorize, validate the path, read
# in autocommit (one round trip, no BEGIN/COMMIT) on a held read connection (no pool checkout, no ORM
# session unless a pool is involved: db.session.ReadConnections) and encode the answer once
# (docs/performance.md).
_STATUSES = TypeAdapter(list[NamespaceBudgetOut])
router.add_api_route(
    "/namespaces",
    list_namespaces,
    methods=["GET"],
    response_model=list[NamespaceBudgetOut],
    route_class_override=RequestRoute,
    openapi_extra=BEARER,
)
router.add_api_route(
    "/namespaces/{namespace}/budget",
    get_budget,
    methods=["GET"],
    response_model=NamespaceBudgetOut,
    route_class_override=RequestRoute,
    openapi_extra=BEARER | {"parameters": [NAMESPACE_PARAMETER]},
)


@router.put(
    "/namespaces/{namespace}/budget",
    response_model=NamespaceBudgetOut,
    responses={**BODY_ERRORS, **error_responses(409)},
)
async def put_budget(
    namespace: NamespacePath, body: BudgetIn, service: Service, admin: Admin, session: SessionDep
) -> NamespaceBudgetOut:
    await refuse_if_managed(session, namespace)
    return await service.put(namespace, body, admin)


@router.delete(
    "/namespaces/{namespace}/budget", response_model=NamespaceBudgetOut, responses=error_responses(404, 409)
)
async def delete_budget(
    namespace: NamespacePath, service: Service, admin: Admin, session: SessionDep
) -> NamespaceBudgetOut:
    await refuse_if_managed(session, namespace)
    return await service.delete(namespace, admin)


@router.get("/defaults", response_model=BudgetConfigOut)
async def get_defaults(service: Service, _: Admin) -> BudgetConfigOut:
    return await service.default()


@router.put("/defaults", response_model=BudgetConfigOut, responses={**BODY_ERRORS, **error_responses(409)})
async def put_defaults(
    body: BudgetIn, service: Service, admin: Admin, session: SessionDep
) -> BudgetConfigOut:
    await refuse_if_managed(session, None)
    return await service.put_default(body, admin)


@router.post(
    "/namespaces/{namespace}/grants", response_model=GrantOut, status_code=201, responses=BODY_ERRORS
)
async def create_grant(namespace: NamespacePath, body: GrantIn, service: Service, admin: Admin) -> GrantOut:
    return await service.grant(namespace, body, admin)


@router.get("/namespaces/{namespace}/grants", response_model=list[GrantEntryOut])
async def list_grants(
    namespace: NamespacePath,
    service: Service,
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
    namespace: NamespacePath,
    grant_id: Annotated[int, Path(ge=1, le=BIGINT_MAX)],
    service: Service,
    admin: Admin,
) -> GrantOut:
    """The grant stops counting from now. Revoking it again answers it unchanged."""
    return await service.revoke(namespace, grant_id, admin)
