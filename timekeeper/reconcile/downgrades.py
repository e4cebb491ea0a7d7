"""The writes that downgrade an exhausted namespace's running GPU work: evictions (PodDisruptionBudgets
honoured, for a bounded time), the DELETE past the PDB patience, and deletions whose grace runs too
long shortened. What is due, and in what order, is decided in reconcile/decisions.py."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from timekeeper.clock import Clock
from timekeeper.kube import EvictionResult, KubeClient, KubeError, PodInfo
from timekeeper.metrics import DowngradeMetrics
from timekeeper.reconcile.decisions import (
    downgrade_grace,
    due_workloads,
    eviction_order,
    patience_spent,
    termination_too_long,
)
from timekeeper.reconcile.events import Announcer
from timekeeper.reconcile.pods import PodRegistry, TrackedPod
from timekeeper.reconcile.result import PassResult
from timekeeper.reconcile.workloads import workload_key
from timekeeper.settings import Settings

log = logging.getLogger(__name__)


class Downgrader:
    """Evicts or deletes the due pods; remembers since when each has been due (the PDB patience runs
    from there). `claim_holders`: the pods using a GPU claim, as the pass's claims charge found them."""

    def __init__(
        self,
        kube: KubeClient,
        registry: PodRegistry,
        settings: Settings,
        clock: Clock,
        metrics: DowngradeMetrics,
        announcer: Announcer,
    ) -> None:
        self.kube = kube
        self.registry = registry
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.announcer = announcer
        # uid -> when a pass first found the pod due for downgrade (the PDB patience runs from there)
        self._due_since: dict[str, datetime] = {}

    def forget(self) -> None:
        self._due_since = {}

    async def downgrade(
        self, evicting: dict[str, frozenset[str]], claim_holders: set[str], result: PassResult
    ) -> None:
        """Evict the running GPU workloads of exhausted namespaces whose budget's `running_pod_action` is
        `evict`, each with all its pods that still run above the reduced class (neither at it nor at a
        class their priority policy exempts where an admin listed it: `is_exempt`, the webhook's rule). A
        pod's priority is immutable: its controller recreates it and the webhook gives the new pods the
        reduced class. A workload goes whole or not at all: a gang missing some pods holds GPUs without
        progress. Through the Eviction API (PodDisruptionBudgets honoured, for a bounded time: see
        `_evict_workload`), with a grace of at most `over_budget_max_grace_seconds`; bare pods only when
        configured, a bare pod being one admitted bare (the webhook's protected workload annotation: the
        tenant may drop a running pod's ownerReferences, or have its controller release it, but not
        that); at most `evictions_per_pass` workloads per pass, the longest-running first."""
        workloads = due_workloads(self.registry.pods(), evicting, claim_holders, self.settings)
        now = self.clock.now()
        due = {pod.info.uid for pods in workloads.values() for pod in pods}
        self._due_since = {uid: self._due_since.get(uid, now) for uid in due}
        evicted = 0
        for pods in eviction_order(workloads, now):
            if evicted >= self.settings.evictions_per_pass:
                result.deferred.extend((pod.info.namespace, pod.info.name) for pod in pods)
                continue
            try:
                evicted += await self._evict_workload(pods, result)
            except KubeError as error:
                log.warning(
                    "downgrade_failed",
                    extra={
                        "namespace": pods[0].info.namespace,
                        "pods": [p.info.name for p in pods],
                        "error": str(error),
                    },
                )

    async def bound_terminations(
        self, evicting: dict[str, frozenset[str]], claim_holders: set[str], result: PassResult
    ) -> None:
        """A pod being deleted runs until its deletion's grace ends, and a tenant chooses that grace with
        its own DELETE (a year, say), beyond its spec's: the scheduler waits for a terminating pod rather
        than preempt another, and `downgrade` skips it. A GPU pod at the reduced class, or one due for
        downgrade, whose deletion ends more than `over_budget_max_grace_seconds` (and a minute's slack
        for clocks) from now is deleted again with that grace: the API server shortens a deletion's
        grace, never lengthens it."""
        cap = self.settings.over_budget_max_grace_seconds
        now = self.clock.now()
        for pod in self.registry.pods():
            info = pod.info
            ends = info.deleting_since  # the deletionTimestamp: when the grace ends
            if ends is None or not termination_too_long(pod, evicting, claim_holders, self.settings, now):
                continue
            try:
                shortened = await self.kube.delete_pod(info.namespace, info.name, info.uid, cap)
            except KubeError as error:
                log.warning(
                    "downgrade_failed",
                    extra={"namespace": info.namespace, "pods": [info.name], "error": str(error)},
                )
                continue
            if shortened:
                result.shortened.append((info.namespace, info.name))
                self.metrics.pods.labels(outcome="grace_shortened").inc()
                log.warning(
                    "termination_grace_shortened",
                    extra={
                        "namespace": info.namespace,
                        "pod": info.name,
                        "deletion_ended_at": ends.isoformat(),
                        "grace_seconds": cap,
                    },
                )

    async def _evict_workload(self, pods: list[TrackedPod], result: PassResult) -> bool:
        """Evict every pod of one workload, or none when a PodDisruptionBudget refuses any of them (asked
        first with dry-run evictions); whether it was evicted. A PDB is the tenant's to write, and an
        admin's budget policy is not the tenant's to veto: once any of the workload's pods has been due
        for `downgrade_pdb_patience_seconds`, a refused workload is deleted instead (no PDB is asked)."""
        for pod in pods:
            info = pod.info
            if (
                await self.kube.evict_pod(info.namespace, info.name, dry_run=True)
                is EvictionResult.BLOCKED_BY_PDB
            ):
                if patience_spent(pods, self._due_since, self.clock.now(), self.settings):
                    await asyncio.gather(*(self._delete(pod, result) for pod in pods))
                    return True
                self._blocked(info, result)
                return False
        # All at once: a controller recreating the first pod before the last is gone races the webhook,
        # whose view still holds the rest at the old class.
        await asyncio.gather(*(self._evict(pod, result) for pod in pods))
        return True

    def _blocked(self, info: PodInfo, result: PassResult) -> None:
        result.blocked.append((info.namespace, info.name))
        self.metrics.pods.labels(outcome="blocked_by_pdb").inc()
        due = self._due_since.get(info.uid, self.clock.now())
        log.info(
            "downgrade_blocked_by_pdb",
            extra={
                "namespace": info.namespace,
                "pod": info.name,
                "workload": workload_key(info)[1],
                "due_since": due.isoformat(),
            },
        )

    async def _evict(self, pod: TrackedPod, result: PassResult) -> None:
        info = pod.info
        grace = downgrade_grace(info, self.settings)
        outcome = await self.kube.evict_pod(info.namespace, info.name, grace_period_seconds=grace)
        if outcome is EvictionResult.BLOCKED_BY_PDB:
            self._blocked(info, result)
            return
        if outcome is EvictionResult.EVICTED:
            result.evicted.append((info.namespace, info.name))
            self.metrics.pods.labels(outcome="evicted").inc()
            log.info("downgrade_evicted", extra={"namespace": info.namespace, "pod": info.name})
            await self.announcer.announce_downgrade(info, "evicted")

    async def _delete(self, pod: TrackedPod, result: PassResult) -> None:
        """The DELETE past the PDB patience, with the bounded grace, of this very pod (its uid)."""
        info = pod.info
        grace = downgrade_grace(info, self.settings)
        if not await self.kube.delete_pod(info.namespace, info.name, info.uid, grace):
            return
        result.deleted.append((info.namespace, info.name))
        self.metrics.pods.labels(outcome="deleted_past_pdb").inc()
        log.warning(
            "downgrade_deleted_past_pdb",
            extra={
                "namespace": info.namespace,
                "pod": info.name,
                "grace_seconds": grace,
                "due_since": self._due_since.get(info.uid, self.clock.now()).isoformat(),
            },
        )
        await self.announcer.announce_downgrade(
            info,
            f"deleted after its PodDisruptionBudget refused eviction for "
            f"{self.settings.downgrade_pdb_patience_seconds:g} s",
        )
