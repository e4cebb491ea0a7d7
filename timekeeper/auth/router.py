"""GET /whoami: who the caller's credential stands for and what it may do, so a client (the dashboard,
the CLI) shows only what it may use instead of learning it from 403s."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel

from gpuaccounting.names import DNS_LABEL
from timekeeper.auth.base import Action, Principal
from timekeeper.auth.dependencies import (
    ACCESS,
    ANONYMOUS,
    AuthenticatedPrincipal,
    RequestCluster,
    authorize,
)
from timekeeper.context import Context, ContextDep
from timekeeper.domain.clusters import namespace_key

router = APIRouter(tags=["auth"])


class NamespaceAccessOut(BaseModel):
    namespace: str
    may_read: bool
    may_administer: bool


class WhoAmIOut(BaseModel):
    name: str
    anonymous: bool
    auth_mode: str
    # The member cluster whose API server reviewed the credential (docs/fleet.md); null: the local one.
    cluster: str | None = None
    # The timekeeper's clock (the demo's runs fast): what a client measures "runs out in ..." against.
    now: datetime
    # Cluster-wide, in the caller's cluster: list every namespace; change defaults and read the audit log
    # (the hub's own cluster only), and any namespace's budget.
    may_read_all: bool
    may_administer: bool
    # A credential scoped to namespaces (static mode's scoped tokens) reads exactly these; else null.
    namespaces: list[str] | None
    # Present when asked about one namespace (`?namespace=`): a Kubernetes user may hold rights in some only.
    namespace: NamespaceAccessOut | None = None


async def _may(context: Context, principal: Principal, action: Action, namespace: str | None) -> bool:
    if principal is ANONYMOUS:
        return action is Action.READ and bool(context.settings.anonymous_read)
    return await context[ACCESS].authorize(principal, action, namespace)


@router.get("/whoami", response_model=WhoAmIOut)
async def whoami(
    cluster: RequestCluster,
    context: ContextDep,
    principal: AuthenticatedPrincipal,
    namespace: Annotated[str | None, Query(min_length=1, max_length=63, pattern=DNS_LABEL)] = None,
) -> WhoAmIOut:
    """Anonymous callers are refused (401) unless anonymous reads are on; a token not accepted is 401."""
    key = None if namespace is None else namespace_key(cluster, namespace)
    if principal is ANONYMOUS:
        await authorize(context, principal, Action.READ, key)
    scoped = principal.namespaces
    answer = WhoAmIOut(
        name=principal.name,
        anonymous=principal is ANONYMOUS,
        auth_mode=context.settings.auth_mode,
        cluster=principal.cluster,
        now=context.clock.now(),
        may_read_all=scoped is None and await _may(context, principal, Action.READ, None),
        may_administer=scoped is None and await _may(context, principal, Action.ADMIN, None),
        namespaces=None if scoped is None else sorted(scoped),
    )
    if namespace is not None and key is not None:
        answer.namespace = NamespaceAccessOut(
            namespace=namespace,
            may_read=await _may(context, principal, Action.READ, key),
            may_administer=await _may(context, principal, Action.ADMIN, key),
        )
    return answer
