"""FastAPI dependencies that turn a request's bearer token into an authorized Principal. `_principal` is
the one place a token is authenticated; every route reaches it through a dependency.

In a fleet (docs/fleet.md) a request names its cluster in CLUSTER_HEADER: its token is reviewed by that
cluster's API server, and the namespace in its path means that cluster's, so routes take a `NamespaceKey`
(timekeeper/domain/clusters.py) and everything above this floor speaks keys."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from typing import Annotated

from fastapi import Depends, Header, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.base import SecurityBase
from fastapi.security.utils import get_authorization_scheme_param
from starlette.requests import HTTPConnection

from gpuaccounting.names import CLUSTER_HEADER, DNS_LABEL, PROXIED_AUTHORIZATION_HEADER
from timekeeper.auth.base import AccessControl, Action, Principal
from timekeeper.auth.digests import TokenDigests
from timekeeper.auth.scope import readable_namespaces
from timekeeper.context import Context, ContextDep, Slot, context_of
from timekeeper.domain.clusters import keys_in_cluster, namespace_key
from timekeeper.errors import TimekeeperError

ANONYMOUS = Principal(name="anonymous")
# The context's slots this floor owns (timekeeper/context.py): who may do what, and the metrics tokens.
ACCESS: Slot[AccessControl] = Slot("access")
METRICS_TOKENS: Slot[TokenDigests] = Slot("metrics_tokens")


def bearer_token(request: HTTPConnection) -> str | None:
    """The bearer token of `Authorization`, else (no `Authorization` at all) of PROXIED_AUTHORIZATION_HEADER
    (gpuaccounting/names.py): a caller that comes through the API server's service proxy has its
    `Authorization` removed there. The token is checked exactly as any other. Read as HTTPBearer reads it,
    without its pydantic credentials object: a report reads it twice (`refuse_anonymous`, then the auth
    dependency)."""
    value = request.headers.get("authorization")
    if value is None:  # absent, not empty
        value = request.headers.get(PROXIED_AUTHORIZATION_HEADER)
    scheme, token = get_authorization_scheme_param(value)
    return token if token and scheme.lower() == "bearer" else None


class _Bearer(HTTPBearer):
    """`bearer_token` as FastAPI's HTTPBearer security scheme: what the OpenAPI document names, and the
    credentials of the metrics route."""

    async def __call__(self, request: HTTPConnection) -> HTTPAuthorizationCredentials | None:
        token = bearer_token(request)
        return None if token is None else HTTPAuthorizationCredentials(scheme="Bearer", credentials=token)


_bearer = _Bearer(auto_error=False, description="A static token, or a Kubernetes ServiceAccount token")


_UNAUTHENTICATED = {"WWW-Authenticate": "Bearer"}


# The cluster a request names (absent or empty: the local one). Declared once, so every dependency that
# reads it documents the same header in the OpenAPI document.
ClusterHeader = Annotated[
    str | None,
    Header(
        alias=CLUSTER_HEADER,
        description="the member cluster the caller belongs to (docs/fleet.md); absent: the local one",
    ),
]


def _member_cluster(request: Request, cluster: str | None) -> str | None:
    """`cluster` as CLUSTER_HEADER named it, None for the local cluster. A name that is not one of the
    settings' members is a 400 that says so, whoever the caller: no API server could review its token,
    and no namespace of it is stored here."""
    if not cluster:
        return None
    if cluster not in context_of(request).settings.members:
        raise TimekeeperError(
            f"cluster {cluster[:63]!r} ({CLUSTER_HEADER}) is not a member cluster of this timekeeper", 400
        )
    return cluster


async def request_cluster(request: Request, cluster: ClusterHeader = None) -> str | None:
    """The cluster a request names in CLUSTER_HEADER (`_member_cluster`), for a route that acts on it
    (a namespace key, the snapshot): a dependency, so a request reads it once however many of the
    route's dependencies need it."""
    return _member_cluster(request, cluster)


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
    if bearer_token(request) is None:
        raise TimekeeperError("authentication required", 401, _UNAUTHENTICATED)


RequestCluster = Annotated[str | None, Depends(request_cluster)]


async def _authenticated(request: Request, cluster: str | None, token: str | None) -> Principal:
    """The principal of the bearer `token`, reviewed by `cluster`'s API server (or the static tokens);
    ANONYMOUS without a token; 401 for a token not accepted."""
    if token is None:
        return ANONYMOUS
    principal = await context_of(request)[ACCESS].authenticate(token, cluster)
    if principal is None:
        raise TimekeeperError("token not accepted", 401, _UNAUTHENTICATED)
    return principal


class _Authentication(SecurityBase):
    """The request's principal as one dependency: the cluster it names (CLUSTER_HEADER; one that is not a
    member is refused before any credential is looked at), then its bearer token (`bearer_token`)
    authenticated for that cluster. One dependency, not three (the header's, the token's, the
    principal's): FastAPI's resolution of each costs a request about what pydantic's validation of a whole
    report does (docs/performance.md, "What a report costs"). A security scheme itself, `_bearer`'s, so the
    OpenAPI document names the same scheme on the same routes."""

    def __init__(self) -> None:
        self.model = _bearer.model
        self.scheme_name = _bearer.scheme_name

    async def __call__(self, request: Request, cluster: ClusterHeader = None) -> Principal:
        _, principal = await self.principal(request, cluster)
        return principal

    async def principal(self, request: Request, cluster: str | None) -> tuple[str | None, Principal]:
        """The member cluster the request names (None: the local one) and its principal."""
        member = _member_cluster(request, cluster)
        return member, await _authenticated(request, member, bearer_token(request))


_principal = _Authentication()


AuthenticatedPrincipal = Annotated[Principal, Depends(_principal)]


# A namespace in a path: the request's cluster's (NamespaceKey makes it the key it is stored under).
NamespacePath = Annotated[
    str, Path(min_length=1, max_length=63, pattern=DNS_LABEL, description="a namespace")
]


async def _namespace_key(cluster: RequestCluster, namespace: NamespacePath) -> str:
    return namespace_key(cluster, namespace)


# What a route that takes a namespace from its path acts on: the namespace key of the request's cluster
# (the bare name for the local cluster, as before fleets).
NamespaceKey = Annotated[str, Depends(_namespace_key)]


def _fleet_wide_refused(principal: Principal, action: Action) -> TimekeeperError:
    return TimekeeperError(
        f"{principal.name} of member cluster {principal.cluster} may not {action.value} across the fleet:"
        " only the hub's own cluster's principals may",
        403,
    )


class _Authorization(_Authentication):
    """`require`'s dependency: the principal (as `_Authentication`), authorized for one action, in the same
    one dependency."""

    def __init__(self, action: Action, fleet_wide: bool) -> None:
        super().__init__()
        self.action = action
        self.fleet_wide = fleet_wide

    async def __call__(self, request: Request, cluster: ClusterHeader = None) -> Principal:
        member, principal = await self.principal(request, cluster)
        namespace = request.path_params.get("namespace")
        if namespace is None and self.fleet_wide and principal.cluster is not None:
            raise _fleet_wide_refused(principal, self.action)
        key = None if namespace is None else namespace_key(member, namespace)
        await authorize(context_of(request), principal, self.action, key)
        return principal


@cache
def require(action: Action, fleet_wide: bool = False) -> Callable[..., Awaitable[Principal]]:
    """A dependency: the caller may perform `action` on the path's namespace (its key in the request's
    cluster), else across the caller's cluster; with `fleet_wide`, a route without a namespace acts on
    every cluster (defaults, prices, the audit log), which a member cluster's principal may not. One per
    action, so a route that needs it twice authorizes once."""
    return _Authorization(action, fleet_wide)


Reader = Annotated[Principal, Depends(require(Action.READ))]
# Changes to one namespace (its key), or to what every cluster shares: the hub's own principals only.
Admin = Annotated[Principal, Depends(require(Action.ADMIN, fleet_wide=True))]


async def read_scope(
    cluster: RequestCluster, context: ContextDep, principal: AuthenticatedPrincipal
) -> frozenset[str] | None:
    """Which namespace keys a listing may show the caller: a scoped credential's own; (None) every one,
    for a caller of the local cluster that may read cluster-wide (the hub's view of the fleet); every
    known one of its cluster for a member's caller that may; else the known ones of its cluster it may
    read one by one, possibly none (an empty list, not a 403: the listing answers "what may I read", and
    "nothing" is an answer)."""
    if principal.namespaces is not None:
        return principal.namespaces
    if principal is ANONYMOUS:
        await authorize(context, principal, Action.READ, None)  # 401 unless anonymous reads are on
    elif not await context[ACCESS].authorize(principal, Action.READ, None):
        return await readable_known_namespaces(context, principal)
    if cluster is None:
        return None
    known = await context.known_namespaces(context.sessions)
    return frozenset(keys_in_cluster(known, cluster))


async def readable_known_namespaces(context: Context, principal: Principal) -> frozenset[str]:
    """The known namespaces of the principal's cluster it may read, one authorization each
    (timekeeper/auth/scope.py)."""
    known = await context.known_namespaces(context.sessions)  # budgets.states.repository.known_namespaces
    return await readable_namespaces(
        context[ACCESS],
        principal,
        keys_in_cluster(known, principal.cluster),
        context.settings.read_scope_concurrency,
    )


ReadScope = Annotated[frozenset[str] | None, Depends(read_scope)]


async def _metrics_access(
    request: Request,
    cluster: RequestCluster,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """`TIMEKEEPER_METRICS_AUTH=token`: a metrics token, or a credential that may read every namespace
    (the scrape shows them all)."""
    context = context_of(request)
    if context.settings.metrics_auth == "open":
        return
    if credentials is not None and context[METRICS_TOKENS].match(credentials.credentials):
        return
    principal = await _authenticated(
        request, cluster, None if credentials is None else credentials.credentials
    )
    if principal.cluster is not None:  # the scrape shows every cluster's namespaces
        raise _fleet_wide_refused(principal, Action.READ)
    await authorize(context, principal, Action.READ, None)


MetricsAccess = Depends(_metrics_access)


def check_pod_identity(principal: Principal, namespace: str, pod: str, pod_uid: str) -> None:
    """A credential bound to one pod may report only for that pod (`namespace`: the bare name, in the
    principal's cluster)."""
    bound = principal.pod
    if bound is not None and (bound.namespace, bound.name, bound.uid) != (namespace, pod, pod_uid):
        raise TimekeeperError(
            f"{principal.name} is bound to pod {bound.namespace}/{bound.name} and may report only for it", 403
        )
