"""The sync from GPUBudget objects to the database, the periodic jobs' leader's alone: each spec that
differs is applied through BudgetService (as a REST PUT), a namespace whose object is gone returns to the
default, changed statuses are written. Level-based: the next pass repairs whatever a pass missed. A hub
runs one sync per cluster, its own and each member's (docs/fleet.md), each through that cluster's API
server and over that cluster's namespace keys only."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from timekeeper.auth.base import Principal
from timekeeper.auth.kubernetes import ClusterIdentities, cluster_kube_configs
from timekeeper.budgets.managed.repository import ManagedRepository, ObjectRef
from timekeeper.budgets.schemas import BudgetIn
from timekeeper.budgets.service import BudgetService
from timekeeper.clock import Clock
from timekeeper.domain.clusters import LOCAL_CLUSTER_LABEL, cluster_of, namespace_key
from timekeeper.errors import TimekeeperError
from timekeeper.gitops.objects import (
    BUDGET_KIND,
    BUDGETS,
    DEFAULT_KIND,
    DEFAULT_NAME,
    DEFAULTS,
    GROUP,
    VERSION,
    Readiness,
    SpecError,
    applied,
    budget_in,
    budget_status,
    default_status,
    object_ref,
    owner_of,
    stored_json,
    substance,
    well_formed,
)
from timekeeper.kube import KubeApiError, KubeClient, KubeUnavailableError
from timekeeper.metrics import GitOpsMetrics
from timekeeper.settings import Settings

log = logging.getLogger(__name__)
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
DEBOUNCE_SECONDS = 0.5


@dataclass
class SyncResult:
    """What one pass did (for logs and tests)."""

    applied: list[str] = field(default_factory=list)  # objects whose spec was written to the database
    released: list[str] = field(default_factory=list)  # namespaces returned to the default
    not_ready: dict[str, str] = field(default_factory=dict)  # object -> why its spec is not in force
    statuses: int = 0  # status subresources written


class GitOpsSync:
    """One cluster's sync, a LeaderService of the periodic runner: the pass loop runs while this replica
    leads. `cluster` None is the hub's own cluster, whose objects set its namespaces and the default; a
    member's name, read through `kube` (that member's API server): its GPUBudgets set `<member>/<ns>`
    only, and the default stays the hub's (a member's admin is input, never the fleet's policy)."""

    def __init__(
        self,
        kube: KubeClient,
        sessionmaker: async_sessionmaker[AsyncSession],
        settings: Settings,
        clock: Clock,
        metrics: GitOpsMetrics,
        cluster: str | None = None,
        identities: ClusterIdentities | None = None,
    ) -> None:
        self.kube = kube
        self.cluster = cluster
        self.identities = identities
        self.label = LOCAL_CLUSTER_LABEL if cluster is None else cluster
        self.plurals = (BUDGETS, DEFAULTS) if cluster is None else (BUDGETS,)
        self.sessionmaker = sessionmaker
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self._task: asyncio.Task[None] | None = None
        # What this leadership has seen in force: object uid -> generation (its spec then needs no
        # database read: only the sync writes what an object governs), and when each object's status
        # was last written (figures alone are written at most every gitops_status_interval_seconds).
        self._in_force: dict[str, int] = {}
        self._written: dict[str, float] = {}
        # Set by the watches when an object changes: the next pass starts then, not at the interval.
        self._changed = asyncio.Event()
        self._watches: list[asyncio.Task[None]] = []

    async def start_leading(self) -> None:
        self._in_force.clear()
        self._written.clear()
        self._watches = [
            asyncio.create_task(self._follow(plural), name=f"gitops-watch-{plural}")
            for plural in self.plurals
        ]
        self._task = asyncio.create_task(self._loop(), name="gitops-sync")

    async def stop_leading(self) -> None:
        tasks = [task for task in (self._task, *self._watches) if task is not None]
        self._task, self._watches = None, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _follow(self, plural: str) -> None:
        async with aclosing(self.kube.watch_custom_objects(GROUP, VERSION, plural)) as changes:
            async for _ in changes:
                self._changed.set()

    async def aclose(self) -> None:
        await self.stop_leading()
        await self.kube.close()

    async def _loop(self) -> None:
        while True:
            self._changed.clear()
            try:
                result = await self.run_pass()
            except KubeApiError as error:
                # 404: the CRDs are not installed (deployment/base/crds); 403: RBAC lacks the rules.
                log.warning(
                    "gitops_sync_refused",
                    extra={"cluster": self.label, "status": error.status, "error": str(error)},
                )
                self.metrics.passes.labels(cluster=self.label, outcome="error").inc()
            except KubeUnavailableError as error:
                # This cluster's API server is away (a member the hub cannot reach): the other clusters'
                # syncs run on their own; this one tries again at the next interval.
                log.warning("gitops_sync_unreachable", extra={"cluster": self.label, "error": str(error)})
                self.metrics.passes.labels(cluster=self.label, outcome="error").inc()
            except Exception:
                # The next pass starts from the cluster and the database again: nothing is half-done.
                log.exception("gitops_sync_failed", extra={"cluster": self.label})
                self.metrics.passes.labels(cluster=self.label, outcome="error").inc()
            else:
                self.metrics.passes.labels(cluster=self.label, outcome="ok").inc()
                if result.applied or result.released:
                    log.info(
                        "gitops_sync_applied",
                        extra={"cluster": self.label, "applied": result.applied, "released": result.released},
                    )
            try:
                async with asyncio.timeout(self.settings.gitops_interval_seconds):
                    await self._changed.wait()
            except TimeoutError:
                continue
            # Woken by a change: a moment more gathers a burst (a GitOps tool applying many objects,
            # the status writes of the last pass) into one pass.
            await asyncio.sleep(DEBOUNCE_SECONDS)

    def _service(self, session: AsyncSession) -> BudgetService:
        return BudgetService(session, self.settings, self.clock)

    async def _list(self, plural: str) -> list[dict[str, Any]]:
        """This cluster's objects of `plural` that can be synced; one that cannot (objects.well_formed)
        is logged and left alone, governing nothing."""
        listed = await self.kube.list_custom_objects(GROUP, VERSION, plural)
        objects = [obj for obj in listed if well_formed(obj, namespaced=plural == BUDGETS)]
        if len(objects) < len(listed):
            log.warning(
                "gitops_objects_malformed",
                extra={"cluster": self.label, "plural": plural, "count": len(listed) - len(objects)},
            )
        for obj in objects:
            if not isinstance(obj.get("status"), dict):
                obj.pop("status", None)  # written whole at the end of the pass
        return objects

    async def run_pass(self) -> SyncResult:
        if self.identities is not None:
            await self.identities.admit(self.cluster)  # one API server under two names syncs under neither
        budgets = await self._list(BUDGETS)
        defaults = await self._list(DEFAULTS) if self.cluster is None else []
        result = SyncResult()
        now = self.clock.now()
        by_namespace: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for obj in budgets:
            by_namespace[obj["metadata"]["namespace"]].append(obj)
        owners = {namespace: owner_of(objects) for namespace, objects in by_namespace.items()}
        # The keys this cluster's objects govern: of this cluster's namespaces, whatever they are named.
        keys = {namespace: namespace_key(self.cluster, namespace) for namespace in owners}
        default = next((o for o in defaults if o["metadata"]["name"] == DEFAULT_NAME), None)
        readiness: dict[str, Readiness] = {}

        async with self.sessionmaker() as session, session.begin():
            managed = {
                key: ref
                for key, ref in (await ManagedRepository(session).all()).items()
                if cluster_of(key) == self.cluster  # another cluster's objects are its own sync's
            }
        governed = set(keys.values())
        for key, ref in managed.items():
            still_there = key in governed if key else default is not None
            if still_there:
                continue
            await self._release(key, ref, now)
            if key:
                result.released.append(key)

        for namespace, obj in owners.items():
            ref = object_ref(BUDGET_KIND, obj, self.cluster)
            readiness[ref.uid] = await self._apply(ref, obj.get("spec"), managed.get(ref.key), now, result)
            for other in by_namespace[namespace]:
                if other is not obj:
                    readiness[other["metadata"]["uid"]] = Readiness(
                        False,
                        "Conflict",
                        f"namespace {namespace} is governed by {ref.display}, the older GPUBudget there: "
                        "delete this one",
                    )
        if default is not None:
            ref = object_ref(DEFAULT_KIND, default)
            readiness[ref.uid] = await self._apply(ref, default.get("spec"), managed.get(""), now, result)
        for obj in defaults:
            if obj is not default:
                readiness[obj["metadata"]["uid"]] = Readiness(
                    False, "Ignored", f"only the {DEFAULT_KIND} named `{DEFAULT_NAME}` sets the default"
                )

        async with self.sessionmaker() as session, session.begin():
            found = await self._service(session).some(sorted(governed))
        figures = {namespace_key(b.cluster, b.namespace): b for b in found}
        for obj in budgets:
            meta = obj["metadata"]
            ready = readiness[meta["uid"]]
            status = budget_status(
                figures[keys[meta["namespace"]]], ready, meta.get("generation", 0), obj.get("status"), now
            )
            result.statuses += await self._write_status(BUDGETS, obj, status)
        for obj in defaults:
            meta = obj["metadata"]
            status = default_status(readiness[meta["uid"]], meta.get("generation", 0), obj.get("status"), now)
            result.statuses += await self._write_status(DEFAULTS, obj, status)
        for kind, objects in ((BUDGET_KIND, budgets), (DEFAULT_KIND, defaults)):
            for obj in objects:
                ready = readiness[obj["metadata"]["uid"]]
                if not ready.ready:
                    result.not_ready[object_ref(kind, obj, self.cluster).display] = ready.message
        self.metrics.not_ready.labels(cluster=self.label).set(len(result.not_ready))
        return result

    async def _apply(
        self,
        ref: ObjectRef,
        spec: dict[str, Any] | None,
        claimed: ObjectRef | None,
        now: datetime,
        result: SyncResult,
    ) -> Readiness:
        """Claim what the object governs (the REST API refuses it from then on) and, when its spec is
        valid and differs from the budget in force, apply it whole: one transaction. A spec this
        leadership has already seen in force, of an object already claimed, needs no transaction."""
        try:
            body: BudgetIn | None = budget_in(spec)
        except SpecError as error:
            body, readiness = None, Readiness(False, "InvalidSpec", f"not applied: {error}")
        else:
            readiness = applied(ref)
        owned = claimed is not None and (claimed.kind, claimed.name, claimed.uid) == (
            ref.kind,
            ref.name,
            ref.uid,
        )
        if owned and (body is None or self._in_force.get(ref.uid) == ref.generation):
            return readiness
        try:
            changed = await self._write(ref, body, owned, now)
        except TimekeeperError as error:  # refused by the service: this object's, not the pass's, problem
            return Readiness(False, "ApplyFailed", f"not applied: {error.message}")
        if body is None:
            return readiness
        if changed:
            result.applied.append(ref.display)
            self.metrics.changes.labels(cluster=self.label, action="applied").inc()
        self._in_force[ref.uid] = ref.generation
        return readiness

    async def _write(self, ref: ObjectRef, body: BudgetIn | None, owned: bool, now: datetime) -> bool:
        """The claim (unless the object holds it already) and the spec where it differs from the budget in
        force, in one transaction; whether the budget changed."""
        async with self.sessionmaker() as session, session.begin():
            if not owned:
                await ManagedRepository(session).claim(ref, now)
            if body is None:
                return False
            service, principal = self._service(session), Principal(ref.actor, cluster=self.cluster)
            if ref.kind == DEFAULT_KIND:
                if (await service.repository.default()).as_json() == stored_json(body, cluster_default=True):
                    return False
                await service.put_default(body, principal)
                return True
            own = await service.repository.own(ref.key)
            if own is not None and own.as_json() == stored_json(body, cluster_default=False):
                return False
            await service.put(ref.key, body, principal)
            return True

    async def _release(self, key: str, ref: ObjectRef, now: datetime) -> None:
        """The object is gone: its namespace returns to the default (audited, naming it); the default
        stays as last applied. Either way the REST API may change it again."""
        async with self.sessionmaker() as session, session.begin():
            if key:
                try:
                    await self._service(session).delete(
                        key, Principal(f"{ref.actor} (deleted)", cluster=self.cluster)
                    )
                except TimekeeperError as error:
                    if error.status_code != HTTP_NOT_FOUND:  # never applied (its spec was invalid)
                        raise
                else:
                    self.metrics.changes.labels(cluster=self.label, action="released").inc()
            await ManagedRepository(session).release(key)

    async def _write_status(self, plural: str, obj: dict[str, Any], status: dict[str, Any]) -> int:
        """Write the status where it says something new; 1 when written. Figures alone are written at most
        every gitops_status_interval_seconds per object, anything else at once; a conflict or a deletion is
        left to the next pass."""
        before = obj.get("status") or {}
        if before == status:
            return 0
        uid = obj["metadata"]["uid"]
        moment = time.monotonic()
        last = self._written.get(uid)
        figures_only = substance(before) == substance(status)
        if figures_only and last is not None and moment - last < self.settings.gitops_status_interval_seconds:
            return 0
        try:
            await self.kube.replace_custom_object_status(GROUP, VERSION, plural, {**obj, "status": status})
        except KubeApiError as error:
            # 404/409: deleted or changed since the list; the next pass writes what is then true. Any
            # other refusal is this object's: logged, and the other objects' statuses still written.
            if error.status not in (HTTP_NOT_FOUND, HTTP_CONFLICT):
                log.warning(
                    "gitops_status_refused",
                    extra={
                        "cluster": self.label,
                        "object": obj["metadata"]["name"],
                        "status": error.status,
                        "error": str(error),
                    },
                )
            return 0
        self._written[uid] = moment
        return 1


class FleetGitOpsSync:
    """Every cluster's sync as one LeaderService: the hub's own and each member's, each with its own
    client, watches and pass loop, so a member that cannot be reached (or answers nonsense) delays no
    other cluster's budgets."""

    def __init__(self, syncs: Sequence[GitOpsSync], metrics: GitOpsMetrics) -> None:
        self.syncs = tuple(syncs)
        self.metrics = metrics

    async def start_leading(self) -> None:
        for sync in self.syncs:
            await sync.start_leading()

    async def stop_leading(self) -> None:
        for sync in self.syncs:
            await sync.stop_leading()

    async def aclose(self) -> None:
        for sync in self.syncs:
            await sync.aclose()


async def build_gitops_sync(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], clock: Clock
) -> FleetGitOpsSync:
    """The periodic GPUBudget sync of the hub's own cluster and of each member (Settings.members, through
    the kubeconfig the hub reviews that member's callers with), each with a Kubernetes client of its own
    (closed by `aclose`), and their metrics (`metrics`, for the runner to register)."""
    metrics = GitOpsMetrics([LOCAL_CLUSTER_LABEL, *settings.members])
    clients: dict[str | None, KubeClient] = {}
    try:
        for cluster, config in cluster_kube_configs(settings).items():
            clients[cluster] = await KubeClient.from_config(config)
    except BaseException:
        for kube in clients.values():
            await kube.close()
        raise
    identities = ClusterIdentities.of(clients) if settings.members else None
    syncs = [
        GitOpsSync(kube, sessionmaker, settings, clock, metrics, cluster, identities)
        for cluster, kube in clients.items()
    ]
    return FleetGitOpsSync(syncs, metrics)
