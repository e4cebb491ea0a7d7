"""Kubernetes auth mode: TokenReview for who is calling, SubjectAccessReview for what they may do.

Rules:
- a sidecar's projected token (audience `gpu-timekeeper`) stands for its pod, which alone may report;
- any token the API server accepts for its own audiences stands for a user with no pod, who never reports
  (`accept_api_tokens=False` turns this off);
- reading a namespace is `get gpubudgets` there (`list` at cluster scope for all); changing budgets,
  defaults and grants, and reading the audit log, is `update gpubudgets` (cluster scope for the last two).
Both reviews are cached briefly, keyed by a SHA-256 of the token or by the user, groups and question.

A fleet's hub (docs/fleet.md) holds one such access control per cluster, each asking that cluster's API
server with the credentials of the member's kubeconfig, behind FleetAccessControl: a token is reviewed by
the cluster the request names, and its principal is asked about its own cluster's namespaces only. A
member is served only once its identity (ClusterIdentities) is read and is no other cluster's: one API
server under two names would give each of its namespaces two keys, and two budgets."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import TypeVar

from cachetools import TTLCache

from gpuaccounting.names import DOMAIN, TOKEN_AUDIENCE
from timekeeper.auth.base import Action, PodIdentity, Principal
from timekeeper.domain.clusters import split_key
from timekeeper.errors import TimekeeperError
from timekeeper.kube.client import KubeClient, KubeConfig, kube_limits, refuse_unsafe_kubeconfig
from timekeeper.kube.types import POD_NAME_EXTRA, POD_UID_EXTRA, KubeError, TokenReviewResult
from timekeeper.settings import Settings

BUDGET_RESOURCE = "gpubudgets"
BUDGET_GROUP = DOMAIN
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
# What a 503 for an API server that failed us asks the caller to wait (the sidecar and webhook retry with
# their own backoff anyway): about the time an API server takes to come back from a restart.
RETRY_AFTER_SECONDS = 10

log = logging.getLogger(__name__)
T = TypeVar("T")


def principal_from_review(review: TokenReviewResult, pod_bound: bool = True) -> Principal | None:
    """The principal an authenticated review names; bound to a pod only when the token is a pod-bound token
    for our audience."""
    if not review.authenticated or not review.username:
        return None
    pod = None
    if pod_bound and review.username.startswith(SERVICE_ACCOUNT_PREFIX):
        namespace = review.username[len(SERVICE_ACCOUNT_PREFIX) :].split(":", 1)[0]
        pod_name, pod_uid = review.extra_value(POD_NAME_EXTRA), review.extra_value(POD_UID_EXTRA)
        if namespace and pod_name and pod_uid:
            pod = PodIdentity(namespace=namespace, name=pod_name, uid=pod_uid)
    return Principal(name=review.username, pod=pod, groups=review.groups)


def _cluster_name(cluster: str | None) -> str:
    return "the hub's own cluster" if cluster is None else f"member cluster {cluster}"


def _unavailable(cluster: str | None, what: str, why: str = "") -> TimekeeperError:
    """A 503 with Retry-After that names the cluster: the caller is not wrong (no 401), and nothing broke
    here (no 500)."""
    return TimekeeperError(
        f"the Kubernetes API server of {_cluster_name(cluster)} cannot {what} now{why}; retry later",
        503,
        {"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


async def _ask(
    review: Callable[[], Awaitable[T]],
    cluster: str | None,
    what: str = "review credentials",
    timeout_seconds: float | None = None,
) -> T:
    """Await a call to `cluster`'s API server, for no longer than `timeout_seconds` (None: its client's
    request timeout); one that fails us (down, unreachable, slow, refusing the hub's credentials) is a 503."""
    try:
        async with asyncio.timeout(timeout_seconds):
            return await review()
    except (KubeError, TimeoutError) as error:
        log.warning("kubernetes_review_failed", extra={"cluster": cluster, "error": repr(error)})
        raise _unavailable(cluster, what) from error


IDENTITY = "tell its identity (namespace kube-system)"


async def identity_of(kube: KubeClient, cluster: str | None) -> str:
    """`cluster`'s identity (KubeClient.cluster_id), or a 503 naming it while its API server fails us."""
    return await _ask(kube.cluster_id, cluster, IDENTITY)


class KubernetesAccessControl:
    """AccessControl through the Kubernetes API (see the module docstring for the rules)."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        audience: str = TOKEN_AUDIENCE,
        accept_api_tokens: bool = True,
        token_ttl_seconds: float = 30.0,
        rejected_token_ttl_seconds: float = 5.0,
        decision_ttl_seconds: float = 10.0,
        max_entries: int = 50_000,
        timer: Callable[[], float] = time.monotonic,
        owns_client: bool = False,
        cluster: str | None = None,
        reviews_in_flight: int | None = None,
        review_timeout_seconds: float | None = None,
    ) -> None:
        self._kube = kube
        # A member's bounds (None: none, the hub's own cluster): how many reviews may wait on its API
        # server at once (each holds a hub connection; one more waits as long as a review may take, then
        # is a 503) and for how long.
        self._in_flight = None if reviews_in_flight is None else asyncio.Semaphore(reviews_in_flight)
        self._review_timeout = review_timeout_seconds
        # The cluster whose API server `kube` reaches (None: the local one): its principals carry it.
        self._cluster = cluster
        self._owns_client = owns_client
        self._audiences = (audience,)
        self._accept_api_tokens = accept_api_tokens
        # Rejections are kept for less time: a pod's token is rejected until the pod exists.
        self._accepted: TTLCache[str, Principal] = TTLCache(max_entries, token_ttl_seconds, timer=timer)
        self._rejected: TTLCache[str, bool] = TTLCache(max_entries, rejected_token_ttl_seconds, timer=timer)
        self._decisions: TTLCache[tuple[str, tuple[str, ...], str, str], bool] = TTLCache(
            max_entries, decision_ttl_seconds, timer=timer
        )

    async def _ask(self, review: Callable[[], Awaitable[T]], what: str = "review credentials") -> T:
        """_ask this access control's API server, within its bounds: reviews_in_flight reviews at once on
        it, a review more waiting for one of them no longer than a review may take, then a 503 (a slow
        member's server then holds that many reviews, not every connection a caller can open; a burst,
        such as one reader's listing, waits its turn rather than failing itself)."""
        if self._in_flight is None:
            return await _ask(review, self._cluster, what, self._review_timeout)
        try:
            async with asyncio.timeout(self._review_timeout):
                await self._in_flight.acquire()
        except TimeoutError:
            log.warning("kubernetes_reviews_full", extra={"cluster": self._cluster})
            raise _unavailable(self._cluster, what, " (too many reviews waiting on it)") from None
        try:
            return await _ask(review, self._cluster, what, self._review_timeout)
        finally:
            self._in_flight.release()

    async def authenticate(self, token: str, cluster: str | None = None) -> Principal | None:
        if not token or cluster != self._cluster:
            return None
        key = hashlib.sha256(token.encode()).hexdigest()
        if key in self._rejected:
            return None
        principal = self._accepted.get(key)
        if principal is not None:
            return principal
        review = await self._ask(lambda: self._kube.token_review(token, self._audiences))
        principal = principal_from_review(review)
        if principal is None and self._accept_api_tokens:
            # An empty audience list means the API server's own audiences.
            review = await self._ask(lambda: self._kube.token_review(token, ()))
            principal = principal_from_review(review, pod_bound=False)
        if principal is None:
            self._rejected[key] = True
        else:
            principal = replace(principal, cluster=self._cluster)
            self._accepted[key] = principal
        return principal

    async def authorize(self, principal: Principal, action: Action, namespace: str | None) -> bool:
        """`namespace` is a namespace key: one of another cluster than the principal's is refused without
        asking; the principal's own API server is asked about the bare namespace."""
        if principal.cluster != self._cluster:
            return False
        if namespace is not None:
            cluster, namespace = split_key(namespace)
            if cluster != self._cluster:
                return False
        if action is Action.REPORT:
            # The endpoint checks further that the report's pod name and uid are principal.pod's.
            return principal.pod is not None and namespace in (None, principal.pod.namespace)
        verb = "update" if action is Action.ADMIN else ("get" if namespace else "list")
        key = (principal.name, principal.groups, verb, namespace or "")
        decision = self._decisions.get(key)
        if decision is None:
            decision = await self._ask(
                lambda: self._kube.subject_access_review(
                    principal.name, principal.groups, verb, BUDGET_RESOURCE, BUDGET_GROUP, namespace
                )
            )
            self._decisions[key] = decision
        return decision

    async def cluster_id(self) -> str:
        """The identity of the cluster this access control asks (KubeClient.cluster_id)."""
        return await self._ask(self._kube.cluster_id, IDENTITY)

    async def aclose(self) -> None:
        """Drop the caches, and the client when it was built for this access control."""
        self._accepted.clear()
        self._rejected.clear()
        self._decisions.clear()
        if self._owns_client:
            await self._kube.close()


class ClusterIdentities:
    """Each cluster's identity (KubeClient.cluster_id), read once it answers, and the refusal of a member
    that is the same cluster as another: the hub's own cluster configured as a member, or two members
    reaching one API server. Such a member is refused (a 503 naming both), never the hub's own cluster, and
    two such members both: what a member's API server answers is input, so a member whose server claims
    another's identity refuses itself (and that other member, if it is one), but cannot stop the hub.

    Read at start (`read_all`); a cluster that does not answer then is read at its first request, so a
    member that is down when the hub starts does not keep it from starting, and is checked before it is
    served. The hub's own identity is needed to admit any member."""

    def __init__(self, readers: Mapping[str | None, Callable[[], Awaitable[str]]]) -> None:
        self._readers = readers
        self._ids: dict[str | None, str] = {}

    @classmethod
    def of(cls, clients: Mapping[str | None, KubeClient]) -> ClusterIdentities:
        """The identities of the clusters `clients` reach (the periodic jobs' own clients)."""
        return cls({cluster: partial(identity_of, kube, cluster) for cluster, kube in clients.items()})

    async def read_all(self) -> None:
        """Read every cluster's identity, together; log each that cannot be read yet, and each member
        configured twice (refused from now on)."""
        names = list(self._readers)
        answers = await asyncio.gather(*(self._read(name) for name in names), return_exceptions=True)
        for name, answer in zip(names, answers, strict=True):
            # Whatever one cluster answers (or fails with) keeps no other from being served: logged, and
            # read again at that cluster's first request.
            if isinstance(answer, TimekeeperError):
                log.warning("cluster_identity_unread", extra={"cluster": name, "error": answer.message})
            elif isinstance(answer, Exception):
                log.error("cluster_identity_unread", extra={"cluster": name, "error": repr(answer)})
            elif isinstance(answer, BaseException):
                raise answer
        for name in names:
            same = self._same_as(name)
            if name is not None and same:
                log.error(
                    "cluster_configured_twice",
                    extra={
                        "cluster": name,
                        "same_as": [_cluster_name(other) for other in same],
                        "kube_system_uid": self._ids[name],
                    },
                )

    async def admit(self, cluster: str | None) -> None:
        """Nothing for the hub's own cluster; for a member, its identity and the hub's are read, and it is
        no other cluster's, else a 503 that names them (the caller is not wrong: the configuration is)."""
        if cluster is None:
            return
        await self._read(None)
        await self._read(cluster)
        same = self._same_as(cluster)
        if same:
            raise TimekeeperError(
                f"member cluster {cluster} is the same cluster as {', '.join(map(_cluster_name, same))}"
                " (the same namespace kube-system): the hub serves one API server under one name only, and"
                " refuses this one until its configuration is fixed (docs/fleet.md)",
                503,
            )

    async def _read(self, cluster: str | None) -> None:
        if cluster not in self._ids:
            self._ids[cluster] = await self._readers[cluster]()

    def _same_as(self, cluster: str | None) -> list[str | None]:
        """The other clusters read so far with the identity of `cluster` (none while it is unread)."""
        uid = self._ids.get(cluster)
        return [
            other
            for other, known in self._ids.items()
            if uid is not None and other != cluster and known == uid
        ]


class FleetAccessControl:
    """A hub's access control: each cluster's own (the local one under None), chosen by the cluster the
    request names for a token and by the principal's cluster for a decision, so a member's principal is
    only ever judged by its own API server, and only once ClusterIdentities admits that member. Each keeps
    its own caches."""

    def __init__(self, clusters: Mapping[str | None, KubernetesAccessControl]) -> None:
        self._clusters = dict(clusters)
        self.identities = ClusterIdentities({name: access.cluster_id for name, access in clusters.items()})

    async def authenticate(self, token: str, cluster: str | None) -> Principal | None:
        access = self._clusters.get(cluster)
        if access is None:
            return None
        await self.identities.admit(cluster)
        return await access.authenticate(token, cluster)

    async def authorize(self, principal: Principal, action: Action, namespace: str | None) -> bool:
        access = self._clusters.get(principal.cluster)
        return access is not None and await access.authorize(principal, action, namespace)

    async def aclose(self) -> None:
        for access in self._clusters.values():
            await access.aclose()


def member_kube_config(settings: Settings, cluster: str) -> KubeConfig:
    """How the hub reaches a member's API server: the kubeconfig the admin mounted for it."""
    member = settings.members[cluster]
    refuse_unsafe_kubeconfig(member.kubeconfig)
    return KubeConfig(
        in_cluster=False,
        kubeconfig=member.kubeconfig,
        context=member.context,
        request_timeout_seconds=settings.kube_request_timeout_seconds,
        limits=kube_limits(settings),
    )


def cluster_kube_configs(settings: Settings) -> dict[str | None, KubeConfig]:
    """Every cluster the hub serves and how it reaches each: its own (None) and each member's."""
    configs: dict[str | None, KubeConfig] = {None: KubeConfig.from_settings(settings)}
    configs |= {name: member_kube_config(settings, name) for name in settings.members}
    return configs


async def build_access_control(settings: Settings) -> KubernetesAccessControl | FleetAccessControl:
    """The factory's entry for `TIMEKEEPER_AUTH_MODE=kubernetes` (called in the lifespan): the local
    cluster's access control, behind a FleetAccessControl with one per member when there are members."""
    kube = await KubeClient.from_config(KubeConfig.from_settings(settings))
    local = KubernetesAccessControl(kube, owns_client=True)
    if not settings.members:
        return local
    clusters: dict[str | None, KubernetesAccessControl] = {None: local}
    try:
        for name in settings.members:
            member = await KubeClient.from_config(member_kube_config(settings, name))
            clusters[name] = KubernetesAccessControl(
                member,
                owns_client=True,
                cluster=name,
                reviews_in_flight=settings.member_reviews_in_flight,
                review_timeout_seconds=settings.member_review_timeout_seconds,
            )
        fleet = FleetAccessControl(clusters)
        await fleet.identities.read_all()
    except BaseException:
        for access in clusters.values():
            await access.aclose()
        raise
    return fleet
