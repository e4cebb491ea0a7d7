"""FastAPI dependencies that turn a request's bearer token into an authorized Principal."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from timekeeper.auth.base import AccessControl, Action, Principal
from timekeeper.errors import TimekeeperError

ANONYMOUS = Principal(name="anonymous")
_bearer = HTTPBearer(auto_error=False, description="A static token, or a Kubernetes ServiceAccount token")
_UNAUTHENTICATED = {"WWW-Authenticate": "Bearer"}


async def authorize(request: Request, principal: Principal, action: Action, namespace: str | None) -> None:
    access: AccessControl = request.app.state.access
    if principal is ANONYMOUS:
        if action is Action.READ and request.app.state.settings.anonymous_read:
            return
        raise TimekeeperError("authentication required", 401, _UNAUTHENTICATED)
    if not await access.authorize(principal, action, namespace):
        raise TimekeeperError(f"{principal.name} may not {action.value}", 403)


async def _principal(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    if credentials is None:
        return ANONYMOUS
    principal = await request.app.state.access.authenticate(credentials.credentials)
    if principal is None:
        raise TimekeeperError("token not accepted", 401, _UNAUTHENTICATED)
    return principal


async def authenticated(request: Request) -> Principal:
    """The request's principal, refusing anonymous callers (401), for an endpoint that authenticates
    before it reads its body (POST /reports)."""
    principal = await _principal(request, await _bearer(request))
    if principal is ANONYMOUS:
        raise TimekeeperError("authentication required", 401, _UNAUTHENTICATED)
    return principal


AuthenticatedPrincipal = Annotated[Principal, Depends(_principal)]


def require(action: Action) -> Callable[..., Awaitable[Principal]]:
    """A dependency: the caller may perform `action` on the path's namespace (or cluster-wide)."""

    async def dependency(request: Request, principal: AuthenticatedPrincipal) -> Principal:
        await authorize(request, principal, action, request.path_params.get("namespace"))
        return principal

    dependency.action = action  # type: ignore[attr-defined]  # read by StrictJsonRoute
    return dependency


Reader = Annotated[Principal, Depends(require(Action.READ))]
Admin = Annotated[Principal, Depends(require(Action.ADMIN))]


async def _read_scope(request: Request, principal: AuthenticatedPrincipal) -> frozenset[str] | None:
    """Which namespaces a listing may show the caller: a scoped credential's own, else (None) every
    namespace, for a caller that may read cluster-wide."""
    if principal.namespaces is not None:
        return principal.namespaces
    await authorize(request, principal, Action.READ, None)
    return None


ReadScope = Annotated[frozenset[str] | None, Depends(_read_scope)]


async def _metrics_access(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """`TIMEKEEPER_METRICS_AUTH=token`: a metrics token, or a credential that may read every namespace
    (the scrape shows them all)."""
    if request.app.state.settings.metrics_auth == "open":
        return
    if credentials is not None and request.app.state.metrics_tokens.match(credentials.credentials):
        return
    await authorize(request, await _principal(request, credentials), Action.READ, None)


MetricsAccess = Depends(_metrics_access)


def check_pod_identity(principal: Principal, namespace: str, pod: str, pod_uid: str) -> None:
    """A credential bound to one pod may report only for that pod."""
    bound = principal.pod
    if bound is not None and (bound.namespace, bound.name, bound.uid) != (namespace, pod, pod_uid):
        raise TimekeeperError(
            f"{principal.name} is bound to pod {bound.namespace}/{bound.name} and may report only for it", 403
        )
