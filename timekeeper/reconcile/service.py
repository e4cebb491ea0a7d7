"""The reconciler: the pod watch feeds a PodRegistry (in a thread); a periodic pass, on one replica at a
time (a PostgreSQL advisory lock), charges, closes out, announces, downgrades and applies quotas.

Charging goes through the very function reports use (`UsageRepository.ingest`), so each pod's coverage
ranges decide what is still uncharged: the pass charges a running pod's silent time (older than the
grace), a late sidecar report afterwards charges only what the pass did not, and vice versa.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpuaccounting.names import DOMAIN
from gpuaccounting.shares import GpuHardware
from gpuaccounting.wire import BudgetState
from timekeeper.clock import Clock
from timekeeper.kube import EvictionResult, KubeClient, KubeConfig, KubeError, ObjectReference, QuotaChange
from timekeeper.reconcile.pods import PodRegistry, TrackedPod
from timekeeper.reconcile.quotas import quota_hard
from timekeeper.reconcile.repository import ReconcileRepository
from timekeeper.settings import Settings
from timekeeper.usage.repository import UsageRepository
from timekeeper.usage.schemas import ReportIn

log = logging.getLogger(__name__)

# A sequence number no sidecar reaches; coverage, not the number, is what prevents double charging.
RECONCILER_SEQ = 2**62
EVICT_ANNOTATION = f"{DOMAIN}/evict-when-exhausted"

_TRANSITION_EVENTS: dict[BudgetState, tuple[str, str]] = {
    "exhausted": ("GPUBudgetExhausted", "Warning"),
    "warning": ("GPUBudgetWarning", "Warning"),
    "in_budget": ("GPUBudgetRestored", "Normal"),
    "unlimited": ("GPUBudgetRestored", "Normal"),
}


@dataclass
class PassResult:
    """What one pass did (for logs and tests)."""

    charged: dict[str, Decimal] = field(default_factory=dict)  # pod uid -> GPU-minutes
    closed: list[str] = field(default_factory=list)
    transitions: dict[str, tuple[BudgetState | None, BudgetState]] = field(default_factory=dict)
    evicted: list[tuple[str, str]] = field(default_factory=list)
    blocked: list[tuple[str, str]] = field(default_factory=list)
    quotas: dict[str, QuotaChange] = field(default_factory=dict)


class Reconciler:
    def __init__(
        self,
        kube: KubeClient,
        sessionmaker: async_sessionmaker[AsyncSession],
        settings: Settings,
        clock: Clock,
        hardware: GpuHardware | None = None,
    ) -> None:
        self.kube = kube
        self.sessionmaker = sessionmaker
        self.settings = settings
        self.clock = clock
        self.hardware = hardware or GpuHardware()
        self.registry = PodRegistry(clock, self.hardware)
        self._last_states: dict[str, BudgetState] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None

    # ---- running in the app ----------------------------------------------------------------------------

    def start(self) -> None:
        """The watch in a thread (the client blocks), the passes as a task on the running loop."""
        self._thread = threading.Thread(target=self._watch, name="pod-watch", daemon=True)
        self._thread.start()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def aclose(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # Closing the client ends the open watch, so the thread sees the stop at once.
        await asyncio.to_thread(self.kube.close)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)

    def _watch(self) -> None:
        for item in self.kube.watch_pods(self._stop, timeout_seconds=300):
            self.registry.apply(item)

    async def _loop(self) -> None:
        while not self._stop.is_set():
            if self.registry.synced.is_set():
                try:
                    await self.run_pass()
                except Exception:
                    log.exception("reconcile_pass_failed")
            await asyncio.sleep(self.settings.reconcile_interval_seconds)

    # ---- one pass ----------------------------------------------------------------------------------------

    async def run_pass(self) -> PassResult | None:
        """One reconcile pass, unless another replica holds the lock (then None)."""
        # The lock lives as long as this session's transaction, which does nothing else: ending it (the
        # commit, or the connection closing if this replica dies) lets another replica lead.
        async with self.sessionmaker() as lock_session:
            if not await ReconcileRepository(lock_session).try_lead():
                return None
            try:
                result = PassResult()
                await self._charge(result)
                async with self.sessionmaker() as session:
                    repository = ReconcileRepository(session)
                    states = await repository.states()
                    namespaces = {p.info.namespace for p in self.registry.pods()}
                    limits = await repository.concurrent_limits(namespaces)
                await self._announce(states, result)
                await self._downgrade(states, result)
                await self._apply_quotas(limits, result)
                return result
            finally:
                await lock_session.commit()

    async def _charge(self, result: PassResult) -> None:
        """Charge what no report covered: ended pods up to their real end (once), running pods up to the
        grace. Only pods with uncharged time in that span are touched."""
        now = self.clock.now()
        until = now - timedelta(seconds=self.settings.silent_grace_seconds)
        spans: dict[str, tuple[TrackedPod, datetime, datetime, bool]] = {}
        for pod in self.registry.pods():
            start = pod.info.started_at
            if pod.closed:
                continue
            if start is None:
                if pod.ended_at is not None:  # never started: nothing to charge, nothing to remember
                    self.registry.mark_closed(pod.info.uid)
                continue
            if pod.ended_at is not None:
                spans[pod.info.uid] = (pod, start, pod.ended_at, True)
            elif pod.running and until > start:
                spans[pod.info.uid] = (pod, start, until, False)
        async with self.sessionmaker() as session:
            uncovered = await ReconcileRepository(session).with_uncovered_time(
                (uid, start, end) for uid, (_, start, end, _) in spans.items() if end > start
            )
        for uid, (pod, start, end, final) in spans.items():
            if uid in uncovered:
                result.charged[uid] = await self._charge_pod(pod, start, end, final, now)
            if final:
                self.registry.mark_closed(uid)
                result.closed.append(uid)

    async def _charge_pod(
        self, pod: TrackedPod, start: datetime, end: datetime, final: bool, now: datetime
    ) -> Decimal:
        info = pod.info
        try:
            report = ReportIn(
                namespace=info.namespace,
                pod=info.name,
                pod_uid=info.uid,
                seq=RECONCILER_SEQ,
                interval_start=start,
                interval_end=end,
                gpu_share=pod.share,
                final=final,
            )
        except ValidationError as error:
            log.warning(
                "reconcile_pod_skipped",
                extra={"namespace": info.namespace, "pod": info.name, "error": str(error)},
            )
            return Decimal(0)
        async with self.sessionmaker() as session, session.begin():
            outcome = await UsageRepository(session).ingest(report, now)
        log.info(
            "silent_time_charged",
            extra={
                "namespace": info.namespace,
                "pod": info.name,
                "gpu_minutes": float(outcome.gpu_minutes),
                "final": final,
            },
        )
        return outcome.gpu_minutes

    async def _announce(self, states: dict[str, BudgetState], result: PassResult) -> None:
        """An Event on the namespace for each state change since the last pass (the first pass of a
        replica only learns the states, so a restart does not repeat old news)."""
        last, self._last_states = self._last_states, dict(states)
        if last is None:
            return
        for namespace, state in sorted(states.items()):
            before = last.get(namespace)
            if before == state or (before is None and state in ("in_budget", "unlimited")):
                continue
            result.transitions[namespace] = (before, state)
            reason, type_ = _TRANSITION_EVENTS[state]
            message = f"GPU budget state {before or 'new'} -> {state}"
            if state == "exhausted":
                message += f"; new GPU pods get PriorityClass {self.settings.over_budget_priority_class}"
            await self._post_event(namespace, reason, message, type_)

    async def _downgrade(self, states: dict[str, BudgetState], result: PassResult) -> None:
        """Evict running pods admitted in budget in exhausted namespaces whose policy asks for it, so
        their controllers recreate them at the reduced class. Bare pods only when configured."""
        policy = self.settings.evict_when_exhausted
        if policy == "never":
            return
        in_budget_class = self.settings.in_budget_priority_class
        by_namespace: dict[str, list[TrackedPod]] = {}
        for pod in self.registry.pods():
            info = pod.info
            if (
                states.get(info.namespace) == "exhausted"
                and pod.running
                and info.deleting_since is None
                and (info.raw.get("spec") or {}).get("priorityClassName") == in_budget_class
                and (info.has_controller or self.settings.evict_bare_pods)
            ):
                by_namespace.setdefault(info.namespace, []).append(pod)
        for namespace, pods in sorted(by_namespace.items()):
            try:
                if policy == "annotated":
                    annotations = await asyncio.to_thread(self.kube.namespace_annotations, namespace)
                    if annotations.get(EVICT_ANNOTATION) != "true":
                        continue
                for pod in pods:
                    await self._evict(pod, result)
            except KubeError as error:
                log.warning("downgrade_failed", extra={"namespace": namespace, "error": str(error)})

    async def _evict(self, pod: TrackedPod, result: PassResult) -> None:
        info = pod.info
        outcome = await asyncio.to_thread(self.kube.evict_pod, info.namespace, info.name)
        if outcome is EvictionResult.BLOCKED_BY_PDB:
            result.blocked.append((info.namespace, info.name))
            log.info("downgrade_blocked_by_pdb", extra={"namespace": info.namespace, "pod": info.name})
            return
        if outcome is EvictionResult.EVICTED:
            result.evicted.append((info.namespace, info.name))
            log.info("downgrade_evicted", extra={"namespace": info.namespace, "pod": info.name})
            message = (
                f"evicted: namespace {info.namespace} has spent its GPU budget; its controller recreates "
                f"the pod at PriorityClass {self.settings.over_budget_priority_class}"
            )
            pod_ref = ObjectReference("Pod", info.name, info.namespace, uid=info.uid)
            await self._post_event(info.namespace, "GPUBudgetDowngrade", message, "Warning", pod_ref)
            await self._post_event(
                info.namespace, "GPUBudgetDowngrade", f"pod {info.name} {message}", "Normal"
            )

    async def _apply_quotas(self, limits: dict[str, Decimal | None], result: PassResult) -> None:
        """Each namespace's concurrent GPU limit as our ResourceQuota; ours removed where no limit is."""
        try:
            managed = await asyncio.to_thread(self.kube.managed_quota_namespaces)
            for namespace in sorted(set(limits) | managed):
                limit = limits.get(namespace)
                if limit is not None:
                    hard = quota_hard(limit, self.hardware)
                    change = await asyncio.to_thread(self.kube.apply_resource_quota, namespace, hard)
                elif namespace in managed:
                    change = await asyncio.to_thread(self.kube.delete_resource_quota, namespace)
                else:
                    continue
                if change is not QuotaChange.UNCHANGED:
                    result.quotas[namespace] = change
                    log.info("quota_applied", extra={"namespace": namespace, "change": change.value})
        except KubeError as error:
            log.warning("quota_failed", extra={"error": str(error)})

    async def _post_event(
        self,
        namespace: str,
        reason: str,
        message: str,
        type_: str,
        involved: ObjectReference | None = None,
    ) -> None:
        try:
            await asyncio.to_thread(self.kube.post_event, namespace, reason, message, type_, involved)
        except KubeError as error:
            log.warning("event_failed", extra={"namespace": namespace, "reason": reason, "error": str(error)})


def build_reconciler(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], clock: Clock
) -> Reconciler:
    """The lifespan's reconciler, with a client of its own (closed by `aclose`)."""
    return Reconciler(
        KubeClient.from_config(KubeConfig.from_settings(settings)), sessionmaker, settings, clock
    )
