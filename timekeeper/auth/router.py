"""GET /whoami: who the caller's credential stands for and what it may do, so a client (the dashboard,
the CLI) shows only what it may use instead of learning it from 403s."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel

from gpuaccounting.names import DNS_LABEL
from timekeeper.auth.base import Action, Principal
from timekeeper.auth.dependencies import ACCESS, ANONYMOUS, AuthenticatedPrincipal, authorize
from timekeeper.context import Context, ContextDep

router = APIRouter(tags=["auth"])


class NamespaceAccessOut(BaseModel):
    namespace: str
    may_read: bool
    may_administer: bool


class WhoAmIOut(BaseModel):
    name: str
    anonymous: bool
    auth_mode: str
    # The timekeeper's clock (the demo's runs fast): what a client measures "runs out in ..." against.
    now: datetime
    # Cluster-wide: list every namespace; change defaults and read the audit log (and any namespace's budget).
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
    context: ContextDep,
    principal: AuthenticatedPrincipal,
    namespace: Annotated[str | None, Query(min_length=1, max_length=63, pattern=DNS_LABEL)] = None,
) -> WhoAmIOut:
    """Anonymous callers are refused (401) unless anonymous reads are on; a token not accepted is 401."""
    if principal is ANONYMOUS:
        await authorize(context, principal, Action.READ, namespace)
    scoped = principal.namespaces
    answer = WhoAmIOut(
        name=principal.name,
        anonymous=principal is ANONYMOUS,
        auth_mode=context.settings.auth_mode,
        now=context.clock.now(),
        may_read_all=scoped is None and await _may(context, principal, Action.READ, None),
        may_administer=scoped is None and await _may(context, principal, Action.ADMIN, None),
        namespaces=None if scoped is None else sorted(scoped),
    )
    if namespace is not None:
        answer.namespace = NamespaceAccessOut(
            namespace=namespace,
            may_read=await _may(context, principal, Action.READ, namespace),
            may_administer=await _may(context, principal, Action.ADMIN, namespace),
        )
    return answer
