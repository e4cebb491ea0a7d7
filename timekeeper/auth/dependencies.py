"""FastAPI dependencies that turn a request's bearer token into an authorized Principal. `_principal` is
the one place a token is authenticated; every route reaches it through a dependency."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from gpuaccounting.names import PROXIED_AUTHORIZATION_HEADER
from timekeeper.auth.base import AccessControl, Action, Principal
from timekeeper.auth.digests import TokenDigests
from timekeeper.auth.scope import readable_namespaces
from timekeeper.context import Context, ContextDep, Slot, context_of
from timekeeper.errors import TimekeeperError

ANONYMOUS = Principal(name="anonymous")
# The context's slots this floor owns (timekeeper/context.py): who may do what, and the metrics tokens.
ACCESS: Slot[AccessControl] = Slot("access")
METRICS_TOKENS: Slot[TokenDigests] = Slot("metrics_tokens")


class _Bearer(HTTPBearer):
    """The bearer token of `Authorization`, else of PROXIED_AUTHORIZATION_HEADER (gpuaccounting/names.py):
    a caller that comes through the API server's service proxy has its `Authorization` removed there. The
    token is checked exactly as any other."""

    async def __call__(self, request: HTTPConnection) -> HTTPAuthorizationCredentials | None:
        credentials = await super().__call__(request)
        proxied = request.headers.get(PROXIED_AUTHORIZATION_HEADER)
        if credentials is None and proxied and "authorization" not in request.headers:
            scheme, _, token = proxied.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return HTTPAuthorizationCredentials(scheme=scheme, credentials=token.strip())
        return credentials


_bearer = _Bearer(auto_error=False, description="A static token, or a Kubernetes ServiceAccount token")


_UNAUTHENTICATED = {"WWW-Authenticate": "Bearer"}


async def authorize(context: Context, principal: Principal, action: Action, namespace: str | None) -> None:
    access = context[ACCESS]
    if principal is ANONYMOUS:
        if action is Action.READ and context.settings.anonymous_read:
            return
        raise TimekeeperError("authentication required", 401, _UNAUTHENTICATED)
    if not await access.authorize(principal, action, namespace):
        raise TimekeeperError(f"{principal.name} may not {action.value}", 403)


async def refuse_anonymous(request: Request) -> None:
    """401 for a request that carries no credential at all: what a route whose body FastAPI reads before
    its dependencies calls first, since every such route is a write and no write is anonymous, so an
    anonymous caller never has its body read."""
    if await _bearer(request) is None:
        raise TimekeeperError("authentication required", 401, _UNAUTHENTICATED)


async def _principal(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    if credentials is None:
        return ANONYMOUS
    principal = await context_of(request)[ACCESS].authenticate(credentials.credentials)
    if principal is None:
        raise TimekeeperError("token not accepted", 401, _UNAUTHENTICATED)
    return principal


AuthenticatedPrincipal = Annotated[Principal, Depends(_principal)]


async def reporter(principal: AuthenticatedPrincipal) -> Principal:
    """The caller, refused (401) when anonymous: who may report is decided once the report names its
    namespace."""
    if principal is ANONYMOUS:
        raise TimekeeperError("authentication required", 401, _UNAUTHENTICATED)
    return principal


Reporter = Annotated[Principal, Depends(reporter)]


@cache
def require(action: Action) -> Callable[..., Awaitable[Principal]]:
    """A dependency: the caller may perform `action` on the path's namespace (or cluster-wide). One per
    action, so a route that needs it twice authorizes once."""

    async def dependency(request: Request, principal: AuthenticatedPrincipal) -> Principal:
        await authorize(context_of(request), principal, action, request.path_params.get("namespace"))
        return principal

    return dependency


Reader = Annotated[Principal, Depends(require(Action.READ))]
Admin = Annotated[Principal, Depends(require(Action.ADMIN))]


async def read_scope(context: ContextDep, principal: AuthenticatedPrincipal) -> frozenset[str] | None:
    """Which namespaces a listing may show the caller: a scoped credential's own; (None) every namespace,
    for a caller that may read cluster-wide; else the known namespaces it may read one by one, possibly
    none (an empty list, not a 403: the listing answers "what may I read", and "nothing" is an answer)."""
    if principal.namespaces is not None:
        return principal.namespaces
    if principal is ANONYMOUS:
        await authorize(context, principal, Action.READ, None)  # 401 unless anonymous reads are on
        return None
    if await context[ACCESS].authorize(principal, Action.READ, None):
        return None
    return await readable_known_namespaces(context, principal)


async def readable_known_namespaces(context: Context, principal: Principal) -> frozenset[str]:
    """The known namespaces `principal` may read, one authorization each (timekeeper/auth/scope.py)."""
    known = await context.known_namespaces(context.sessions)  # budgets.states.repository.known_namespaces
    return await readable_namespaces(
        context[ACCESS], principal, known, context.settings.read_scope_concurrency
    )


ReadScope = Annotated[frozenset[str] | None, Depends(read_scope)]


async def _metrics_access(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """`TIMEKEEPER_METRICS_AUTH=token`: a metrics token, or a credential that may read every namespace
    (the scrape shows them all)."""
    context = context_of(request)
    if context.settings.metrics_auth == "open":
        return
    if credentials is not None and context[METRICS_TOKENS].match(credentials.credentials):
        return
    await authorize(context, await _principal(request, credentials), Action.READ, None)


MetricsAccess = Depends(_metrics_access)


def check_pod_identity(principal: Principal, namespace: str, pod: str, pod_uid: str) -> None:
    """A credential bound to one pod may report only for that pod."""
    bound = principal.pod
    if bound is not None and (bound.namespace, bound.name, bound.uid) != (namespace, pod, pod_uid):
        raise TimekeeperError(
            f"{principal.name} is bound to pod {bound.namespace}/{bound.name} and may report only for it", 403
        )
