"""The access-control interface every auth mode implements: a bearer token becomes a Principal
(authentication), then each endpoint asks whether it may perform one Action, on one namespace where the
action concerns one (authorization). Endpoints never look at tokens themselves.

In a fleet (docs/fleet.md) a token is reviewed by the API server of the cluster the request names, and
every namespace asked about is a namespace key (timekeeper/domain/clusters.py), so an access control can
refuse a key of another cluster than the principal's before asking any API server."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class Action(StrEnum):
    REPORT = "report"  # send a usage report for a pod
    READ = "read"  # read a namespace's budget and usage
    ADMIN = "admin"  # change budgets, defaults, grants; read the audit log


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """The pod a credential is bound to (a projected ServiceAccount token names exactly one pod)."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: `name` is what the audit log records; `pod`, when the credential is bound
    to one pod, which may then report only for itself (a static reporter token has none: trusted for every
    pod)."""

    name: str
    pod: PodIdentity | None = None
    # The groups the credential carries (Kubernetes mode asks RBAC about the user and its groups).
    groups: tuple[str, ...] = ()
    # A credential scoped to namespaces (static mode's scoped tokens) reads and reports only in these;
    # None: the access control decides per action and namespace.
    namespaces: frozenset[str] | None = None
    # The member cluster whose API server authenticated the credential (None: the local cluster): every
    # namespace the principal names is one of that cluster's (timekeeper/domain/clusters.py).
    cluster: str | None = None


class AccessControl(Protocol):
    async def authenticate(self, token: str, cluster: str | None) -> Principal | None:
        """The principal a bearer token stands for in `cluster` (None: the local cluster), or None when the
        token is not accepted there. The principal's `cluster` is that cluster."""
        ...

    async def authorize(self, principal: Principal, action: Action, namespace: str | None) -> bool:
        """Whether the principal may perform the action on `namespace`, a namespace key, or (None)
        across the principal's own cluster. A key of another cluster than the principal's is refused."""
        ...

    async def aclose(self) -> None:
        """Release clients and caches; called from the app's lifespan."""
        ...
