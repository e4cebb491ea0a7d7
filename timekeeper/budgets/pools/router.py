"""Pools: admins create, replace and delete them; a member namespace's readers read its pool."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Response

from timekeeper.auth.dependencies import Admin, NamespaceKey, Reader, ReadScope, RequestCluster
from timekeeper.budgets.pools.schemas import PoolIn, PoolOut
from timekeeper.budgets.pools.service import PoolService, seen_from
from timekeeper.context import ContextDep
from timekeeper.db.session import SessionDep
from timekeeper.errors import TimekeeperError
from timekeeper.routing import StrictRoute
from timekeeper.schemas import BODY_ERRORS, error_responses

router = APIRouter(tags=["pools"], route_class=StrictRoute)
PoolPath = Annotated[str, Path(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]


async def _service(context: ContextDep, session: SessionDep) -> PoolService:
    return PoolService(session, context.settings, context.clock)


PoolServiceDep = Annotated[PoolService, Depends(_service)]


@router.get("/pools", response_model=list[PoolOut])
async def list_pools(service: PoolServiceDep, cluster: RequestCluster, scope: ReadScope) -> list[PoolOut]:
    """Every pool; for a credential scoped to namespaces, the pools its namespaces are in."""
    return [seen_from(pool, cluster, scope) for pool in await service.visible(scope)]


@router.get("/pools/{name}", response_model=PoolOut, responses=error_responses(404))
async def get_pool(
    name: PoolPath, service: PoolServiceDep, cluster: RequestCluster, scope: ReadScope
) -> PoolOut:
    """A cluster-wide reader reads any pool; a scoped one only a pool one of its namespaces is in."""
    pool = await service.pool(name)
    if scope is not None and not any(member.namespace in scope for member in pool.members):
        raise TimekeeperError(f"no pool {name} among the caller's namespaces", 404)
    return seen_from(pool, cluster, scope)


@router.put("/pools/{name}", response_model=PoolOut, responses=BODY_ERRORS | error_responses(409))
async def put_pool(name: PoolPath, body: PoolIn, service: PoolServiceDep, admin: Admin) -> PoolOut:
    """The hub's own admins' only, as the defaults are: a pool's name is one across the fleet and its
    members may be any cluster's (`b/team-x`), so a member cluster's admin writes none (docs/fleet.md)."""
    return await service.put(name, body, admin)


@router.delete("/pools/{name}", status_code=204, response_class=Response, responses=error_responses(404))
async def delete_pool(name: PoolPath, service: PoolServiceDep, admin: Admin) -> Response:
    await service.delete(name, admin)
    return Response(status_code=204)


@router.get("/namespaces/{namespace}/pool", response_model=PoolOut, responses=error_responses(404))
async def get_namespace_pool(
    namespace: NamespaceKey, _: Reader, service: PoolServiceDep, cluster: RequestCluster, scope: ReadScope
) -> PoolOut:
    """The pool the namespace is in (404: none), with the figures of its cluster's members."""
    return seen_from(await service.of_namespace(namespace), cluster, scope)
