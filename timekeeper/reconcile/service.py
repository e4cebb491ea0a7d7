"""The reconciler, the scheduler's `reconcile` job, run by the elected leader alone: its pod watch feeds a
PodRegistry and each pass charges silent time through `IngestService.charge` (so reports and passes never
charge the same time twice), closes out ended pods, counts silent sidecars, downgrades and applies quotas."""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpuaccounting.admission_state import is_exempt
from gpuaccounting.names import DEFAULT_TERMINATION_GRACE_SECONDS
from gpuaccounting.wire import BudgetState
from timekeeper.clock import Clock
from timekeeper.domain.periods import Interval
from timekeeper.kube import (
    EvictionResult,
    KubeClient,
    KubeConfig,
    KubeError,
    KubeUnavailableError,
    ObjectReference,
    PodInfo,
    QuotaChange,
)
from timekeeper.kube.client import DRA_GROUP
from timekeeper.metrics import DowngradeMetrics, PodWatchCollector
from timekeeper.pools.service import PoolService
from timekeeper.reconcile.claims import (
    CLAIM_POD_PREFIX,
    ClaimConsumers,
    ClaimPart,
    ClaimRegistry,
    TrackedClaim,
    ran,
)
from timekeeper.reconcile.kueue import KueuePriorities
from timekeeper.reconcile.pods import PodRegistry, TrackedPod
from timekeeper.reconcile.quotas import quota_hard
from timekeeper.reconcile.repository import ReconcileRepository
from timekeeper.reconcile.workloads import workload_key
from timekeeper.settings import Settings
from timekeeper.usage.admitted import NodeModels
from timekeeper.usage.schemas import SilentInterval
from timekeeper.usage.service import IngestService

log = logging.getLogger(__name__)

# A sequence number no sidecar reaches; coverage, not the number, is what prevents double charging.
RECONCILER_SEQ = 2**62
# How far the API server's clock may run ahead of ours before a deletion's end looks too late.
TERMINATION_SLACK = timedelta(minutes=1)

_TRANSITION_EVENTS: dict[BudgetState, tuple[str, str]] = {
    "exhausted": ("GPUBudgetExhausted", "Warning"),
    "warning": ("GPUBudgetWarning", "Warning"),
    "in_budget": ("GPUBudgetRestored", "Normal"),
    "unlimited": ("GPUBudgetRestored", "Normal"),
}


@dataclass
class PassResult:
    """What one pass did (for logs, tests and the job's `detail` in job_runs)."""

    charged: dict[str, Decimal] = field(default_factory=dict)  # pod uid -> GPU-minutes
    claims_charged: dict[str, Decimal] = field(default_factory=dict)  # claim part key -> GPU-minutes
    closed: list[str] = field(default_factory=list)
    transitions: dict[str, tuple[BudgetState | None, BudgetState]] = field(default_factory=dict)
    evicted: list[tuple[str, str]] = field(default_factory=list)
    blocked: list[tuple[str, str]] = field(default_factory=list)  # by a PodDisruptionBudget
    deleted: list[tuple[str, str]] = field(default_factory=list)  # past the PDB patience
    shortened: list[tuple[str, str]] = field(default_factory=list)  # terminating with too long a grace
    deferred: list[tuple[str, str]] = field(default_factory=list)  # past the pass's eviction limit
    kueue_lowered: list[tuple[str, str]] = field(default_factory=list)  # Workloads (reconcile/kueue.py)
    kueue_restored: list[tuple[str, str]] = field(default_factory=list)
    quotas: dict[str, QuotaChange] = field(default_factory=dict)
    silent: list[tuple[str, str]] = field(default_factory=list)  # running pods whose sidecar is silent
    modelled: int = 0  # pods whose GPU model this pass recorded (or found recorded)
    pool_moves: list[str] = field(default_factory=list)  # namespaces a label change moved between pools

    def as_detail(self) -> dict[str, Any]:
        return {
            "charged": {uid: str(minutes) for uid, minutes in self.charged.items()},
            "claims_charged": {key: str(minutes) for key, minutes in self.claims_charged.items()},
            "closed": self.closed,
            "transitions": {ns: list(change) for ns, change in self.transitions.items()},
            "evicted": [list(pod) for pod in self.evicted],
            "blocked": [list(pod) for pod in self.blocked],
            "deleted": [list(pod) for pod in self.deleted],
            "shortened": [list(pod) for pod in self.shortened],
            "deferred": [list(pod) for pod in self.deferred],
            "kueue_lowered": [list(workload) for workload in self.kueue_lowered],
            "kueue_restored": [list(workload) for workload in self.kueue_restored],
            "quotas": {ns: change.value for ns, change in self.quotas.items()},
            "silent": [list(pod) for pod in self.silent],
            "modelled": self.modelled,
            "pool_moves": self.pool_moves,
        }


class Reconciler:
    def __init__(
        self,
        kube: KubeClient,
        sessionmaker: async_sessionmaker[AsyncSession],
        settings: Settings,
        clock: Clock,
    ) -> None:
        self.kube = kube
        self.sessionmaker = sessionmaker
        self.settings = settings
        self.clock = clock
        self.hardware = settings.hardware  # the webhook's sizes too: shares and quotas agree with admission
        self.registry = PodRegistry(clock, self.hardware)
        self.downgrade_metrics = DowngradeMetrics()
        self.kueue = KueuePriorities(kube, sessionmaker, settings, clock, self.downgrade_metrics)
        self.claims = ClaimRegistry()
        self._claim_holders: set[str] = set()  # uids of the pods using a GPU claim (the last pass's)
        self._last_states: dict[str, BudgetState] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._claims_watch: asyncio.Task[None] | None = None
        self._kueue_watch: asyncio.Task[None] | None = None
        # uid -> when a pass first found the pod due for downgrade (the PDB patience runs from there)
        self._due_since: dict[str, datetime] = {}
        self.pod_metrics = PodWatchCollector()
        self._silent: set[str] = set()  # uids found silent by the last pass (logged once per silence)
        self._modelled: set[str] = set()  # uids whose coverage row holds their GPU model
        self._shared: set[str] = set()  # uids whose coverage row holds their admitted share
        self._named: set[str] = set()  # uids whose coverage row holds their workload (or bare pods)
        self._skipped: set[str] = set()  # uids whose silent time could not be charged (logged once)
        self._node_models = NodeModels(kube, clock)

    # ---- leadership: the watch runs only on the leader, whose passes it feeds ----------------------------

    @property
    def watching(self) -> bool:
        return self._watch is not None and not self._watch.done()

    async def start_leading(self) -> None:
        """An emptied registry, filled by the watch's first list and kept current by it (a task on this
        loop). The states are learnt anew, so a change of leader does not repeat old news."""
        self.registry.reset()
        self.claims.reset()
        self._last_states = None
        self._forget_pods()
        self._watch = asyncio.create_task(self._follow(self.registry), name="pod-watch")
        self._claims_watch = asyncio.create_task(self._follow_claims(self.claims), name="claims-watch")
        self._kueue_watch = asyncio.create_task(self.kueue.follow(), name="kueue-watch")

    async def stop_leading(self) -> None:
        """Cancel the watches: their open requests end with the tasks, nothing is left waiting (the next
        leader lists the pods and claims itself). The client stays open for next time."""
        watches = [w for w in (self._watch, self._claims_watch, self._kueue_watch) if w is not None]
        self._watch = self._claims_watch = self._kueue_watch = None
        self._forget_pods()
        for watch in watches:
            watch.cancel()
        await asyncio.gather(*watches, return_exceptions=True)

    def _forget_pods(self) -> None:
        """Not leading (or not yet passed): no pod counts are exported, so only the leader's show."""
        self.pod_metrics.counts = None
        self._silent = set()
        self._modelled = set()
        self._shared = set()
        self._named = set()
        self._skipped = set()
        self._node_models.forget()
        self._claim_holders = set()
        self._due_since = {}
        self.kueue.forget()

    async def aclose(self) -> None:
        await self.stop_leading()
        await self.kube.close()

    async def _follow(self, registry: PodRegistry) -> None:
        try:
            async with aclosing(self.kube.watch_pods(timeout_seconds=300)) as stream:
                async for item in stream:
                    registry.apply(item)
        except Exception:
            log.exception("pod_watch_crashed")
            raise

    async def _follow_claims(self, claims: ClaimRegistry) -> None:
        """Between passes, the claims as they change (one made and deleted between two passes included),
        once discovery finds resource.k8s.io (asked again each reconcile interval until then)."""
        version = None
        while version is None:
            try:
                version = await self.kube.dra_version()
            except KubeError as error:
                log.warning("claims_discovery_failed", extra={"error": str(error)})
            if version is None:
                await asyncio.sleep(self.settings.reconcile_interval_seconds)
        try:
            async with aclosing(self.kube.watch_custom_raw(DRA_GROUP, version, "resourceclaims")) as stream:
                async for _, claim in stream:
                    claims.observe(claim)
        except Exception:
            log.exception("claims_watch_crashed")  # the passes' lists still see every claim that lasts
            raise

    async def wait_synced(self) -> None:
        """Before a pass: the registry must hold a full list (a new leader's watch has just started). Its
        leadership may be lost and taken again meanwhile: then the new watch's list is the one awaited."""
        timeout = self.settings.reconcile_interval_seconds
        try:
            async with asyncio.timeout(timeout):
                while not self.registry.synced.is_set():
                    await self.registry.synced.wait()
        except TimeoutError:
            raise KubeUnavailableError(f"the pod watch has not listed the pods within {timeout} s") from None

    # ---- one pass ----------------------------------------------------------------------------------------

    async def run_pass(self) -> PassResult:
        """One reconcile pass. Only the scheduler's leader runs it (the `reconcile` job), one window at a
        time: the election and the window's job_runs row are the one mechanism, no lock of its own."""
        result = PassResult()
        await self._learn_models(result)
        await self._learn_shares()
        await self._learn_workloads()
        await self._charge_claims(result)  # first: `_charge` forgets ended pods whose time claims still need
        await self._charge(result)
        await self._sync_labels(result)
        async with self.sessionmaker() as session:
            repository = ReconcileRepository(session)
            reports = await repository.sidecar_reports(
                p.info.uid for p in self.registry.pods() if p.running and p.sidecar
            )
            states = await repository.states()
            evicting = await repository.evicting()
            namespaces = {p.info.namespace for p in self.registry.pods()}
            limits = await repository.concurrent_limits(namespaces)
        self._count_pods(reports, result)
        await self._announce(states, result)
        await self._downgrade(evicting, result)
        await self._bound_terminations(evicting, result)
        await self.kueue.run(result.kueue_lowered, result.kueue_restored)
        await self._apply_quotas(limits, result)
        return result

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
            # A pod with no GPUs outside its claims has nothing to charge (its claims' charge has its time).
            uncovered = await ReconcileRepository(session).with_uncovered_time(
                (uid, start, end) for uid, (pod, start, end, _) in spans.items() if end > start and pod.share
            )
        for uid, (pod, start, end, final) in spans.items():
            if uid in uncovered:
                result.charged[uid] = await self._charge_pod(pod, start, end, final, now)
            elif final:
                async with self.sessionmaker() as session, session.begin():
                    await ReconcileRepository(session).close_at(uid, end)
            if final:
                self.registry.mark_closed(uid)
                result.closed.append(uid)

    async def _charge_claims(self, result: PassResult) -> None:
        """Each allocated GPU claim once, whatever the number of its pods, for the time they ran (up to the
        grace), through the report path (docs/timekeeper.md, "DRA claims"). A claim gone from the API whose
        consumers have all ended is closed at their end and forgotten."""
        try:
            version = await self.kube.dra_version()
            if version is None:
                return
            claims = await self.kube.list_dra_objects(version, "resourceclaims")
            slices = await self.kube.list_dra_objects(version, "resourceslices")
        except KubeError as error:
            log.warning("claims_unavailable", extra={"error": str(error)})
            return
        self.claims.update(claims, slices, self.hardware)
        now = self.clock.now()
        until = now - timedelta(seconds=self.settings.silent_grace_seconds)
        consumers = ClaimConsumers(self.registry.pods(), self.hardware.catalogue)
        holders: set[str] = set()
        plans: list[tuple[TrackedClaim, ClaimPart, list[Interval], bool]] = []
        finished: list[str] = []  # forgotten once their final charge is committed
        for uid, claim in self.claims.claims().items():
            users = consumers.of(claim)
            holders.update(pod.info.uid for pod in users)
            final = not claim.listed and all(pod.ended_at is not None for pod in users)
            if final:
                finished.append(uid)
            if consumers.charged_to_pods(claim, users):
                continue  # the scheduler's claim for extended resources its pods' shares count
            spans = ran(users, until)
            plans.extend((claim, part, spans, final) for part in claim.parts if spans)
        self._claim_holders = holders
        flat = [(part.key, start, end) for _, part, spans, _ in plans for start, end in spans]
        async with self.sessionmaker() as session:
            uncovered = await ReconcileRepository(session).uncovered_spans(flat)
        first = 0
        for claim, part, spans, final in plans:
            mine = [index - first for index in range(first, first + len(spans)) if index in uncovered]
            first += len(spans)
            if mine or final:
                minutes = await self._charge_claim_part(claim, part, spans, mine, final, now)
                if mine:
                    result.claims_charged[part.key] = minutes
        for uid in finished:
            self.claims.forget(uid)

    async def _charge_claim_part(
        self,
        claim: TrackedClaim,
        part: ClaimPart,
        spans: list[Interval],
        uncovered: list[int],
        final: bool,
        now: datetime,
    ) -> Decimal:
        """Charge one part of a claim for its spans holding uncharged time (`uncovered`, their positions),
        one charge each at the part's share and model; `final`: then closed at the last span's end."""
        async with self.sessionmaker() as session, session.begin():
            repository = ReconcileRepository(session)
            charged = Decimal(0)
            for index in uncovered:
                start, end = spans[index]
                try:
                    report = SilentInterval(
                        namespace=claim.namespace,
                        pod=f"{CLAIM_POD_PREFIX}{claim.name}"[:253],
                        pod_uid=part.key,
                        seq=RECONCILER_SEQ,
                        interval_start=start,
                        interval_end=end,
                        gpu_share=part.share,
                        final=final and index == len(spans) - 1,
                    )
                except ValidationError as error:
                    log.warning(
                        "reconcile_claim_skipped",
                        extra={"namespace": claim.namespace, "claim": claim.name, "error": str(error)},
                    )
                    return charged
                outcome = await IngestService(session, self.settings).charge_one(
                    report, now, from_sidecar=False, gpu_model=part.model, admitted_share=part.share
                )
                charged += outcome.gpu_minutes
            if final:
                await repository.close_at(part.key, spans[-1][1])
        if uncovered:
            log.info(
                "claim_time_charged",
                extra={
                    "namespace": claim.namespace,
                    "claim": claim.name,
                    "gpu_minutes": float(charged),
                    "final": final,
                },
            )
        return charged

    async def _learn_models(self, result: PassResult) -> None:
        """Each bound GPU pod's GPU model from its node's GPU Feature Discovery label, recorded on its
        coverage row unless one is known (billing weights; its first report may have read it already). A
        node's label is read at most once per NODE_LABEL_TTL; a pod without a row is tried next pass."""
        pods = {
            pod.info.uid: pod.info.node_name
            for pod in self.registry.pods()
            if pod.running and pod.info.node_name and pod.info.uid not in self._modelled
        }
        self._modelled &= {pod.info.uid for pod in self.registry.pods()}
        models: dict[str, str] = {}
        for uid, node in pods.items():
            model = await self._node_models.model(node) if node else None
            if model is not None:
                models[uid] = model
        if models:
            async with self.sessionmaker() as session, session.begin():
                known = await ReconcileRepository(session).record_models(models)
            self._modelled |= known
            result.modelled = len(known)

    async def _learn_shares(self) -> None:
        """Each GPU pod's admitted share, recorded on its coverage row, so that its reports are charged at
        it whatever share they state (static auth mode reads no pod itself); a pod without a row yet is
        tried again next pass."""
        pods = self.registry.pods()
        self._shared &= {pod.info.uid for pod in pods}
        shares = {pod.info.uid: pod.share for pod in pods if pod.info.uid not in self._shared}
        if shares:
            async with self.sessionmaker() as session, session.begin():
                self._shared |= await ReconcileRepository(session).record_admitted_shares(shares)

    async def _learn_workloads(self) -> None:
        """Each GPU pod's workload recorded on its coverage row, for usage by workload (a bare pod has
        none: it counts as itself); a pod without a row yet is tried again next pass."""
        pods = self.registry.pods()
        self._named &= {pod.info.uid for pod in pods}
        keys = {pod.info.uid: workload_key(pod.info)[1] for pod in pods if pod.info.uid not in self._named}
        self._named |= {uid for uid, key in keys.items() if key.startswith("Pod/")}
        named = {uid: key for uid, key in keys.items() if not key.startswith("Pod/")}
        if named:
            async with self.sessionmaker() as session, session.begin():
                self._named |= await ReconcileRepository(session).record_workloads(named)

    async def _sync_labels(self, result: PassResult) -> None:
        """The namespaces' labels, for the pools' selectors (docs/timekeeper.md#pools)."""
        labels = await self.kube.namespace_labels()
        async with self.sessionmaker() as session, session.begin():
            result.pool_moves = await PoolService(session, self.settings, self.clock).sync_labels(labels)

    def _holds_gpus(self, pod: TrackedPod) -> bool:
        """GPUs outside claims, or a GPU claim (a pod whose claims are all NICs, say, is no GPU pod)."""
        return pod.share > 0 or pod.info.uid in self._claim_holders

    def _count_pods(self, reports: dict[str, tuple[datetime, bool]], result: PassResult) -> None:
        """Running GPU pods per namespace, and those with our sidecar whose last report (their start when
        none came) is older than `sidecar_silent_after_seconds`; a sidecar that sent its final report has
        finished, not stopped. Each pod is logged once when it turns silent."""
        now = self.clock.now()
        threshold = timedelta(seconds=self.settings.sidecar_silent_after_seconds)
        counts: dict[str, tuple[int, int]] = {}
        silent: dict[str, tuple[TrackedPod, datetime]] = {}
        for pod in self.registry.pods():
            if not pod.running or not self._holds_gpus(pod):
                continue
            info = pod.info
            running, quiet = counts.get(info.namespace, (0, 0))
            last_report, final = reports.get(info.uid, (info.started_at, False))
            if pod.sidecar and not final and last_report is not None and now - last_report > threshold:
                silent[info.uid] = (pod, last_report)
                quiet += 1
            counts[info.namespace] = (running + 1, quiet)
        for pod, last_report in sorted(
            (silent[uid] for uid in silent.keys() - self._silent),
            key=lambda item: (item[0].info.namespace, item[0].info.name),
        ):
            log.warning(
                "sidecar_silent",
                extra={
                    "namespace": pod.info.namespace,
                    "pod": pod.info.name,
                    "last_report_at": last_report.isoformat(),
                },
            )
        self._silent = set(silent)
        self.pod_metrics.counts = counts
        result.silent = sorted((pod.info.namespace, pod.info.name) for pod, _ in silent.values())

    async def _charge_pod(
        self, pod: TrackedPod, start: datetime, end: datetime, final: bool, now: datetime
    ) -> Decimal:
        """Charge [start, end] minus what is covered at the pod's admitted share, as a report would, in one
        transaction that leaves the pod's last report time alone and, for an ended pod, closes it at its
        end. A pod whose time cannot be charged is logged once, with the reason."""
        info = pod.info
        model = await self._node_models.model(info.node_name) if info.node_name else None
        try:
            report = SilentInterval(
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
            if info.uid not in self._skipped:
                self._skipped.add(info.uid)
                log.warning(
                    "reconcile_pod_skipped",
                    extra={"namespace": info.namespace, "pod": info.name, "error": str(error)},
                )
            return Decimal(0)
        async with self.sessionmaker() as session, session.begin():
            outcome = await IngestService(session, self.settings).charge_one(
                report, now, from_sidecar=False, gpu_model=model, admitted_share=pod.share
            )
            if final:
                await ReconcileRepository(session).close_at(info.uid, end)
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

    async def _downgrade(self, evicting: dict[str, frozenset[str]], result: PassResult) -> None:
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
        workloads: dict[tuple[str, str], list[TrackedPod]] = {}
        for pod in self.registry.pods():
            info = pod.info
            if info.deleting_since is not None or not self._above_reduced(pod, evicting):
                continue
            key = workload_key(info)
            if not key[1].startswith("Pod/") or self.settings.evict_bare_pods:
                workloads.setdefault(key, []).append(pod)
        now = self.clock.now()
        due = {pod.info.uid for pods in workloads.values() for pod in pods}
        self._due_since = {uid: self._due_since.get(uid, now) for uid in due}
        running = sorted(
            (
                sorted(pods, key=lambda pod: (pod.info.started_at or now, pod.info.uid))
                for pods in workloads.values()
                if any(pod.running for pod in pods)
            ),
            key=lambda pods: (pods[0].info.started_at or now, pods[0].info.uid),
        )
        evicted = 0
        for pods in running:
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

    def _above_reduced(self, pod: TrackedPod, evicting: dict[str, frozenset[str]]) -> bool:
        """A GPU pod not ended, of a namespace that evicts, neither at the reduced class nor at a class
        its priority policy exempts there."""
        info = pod.info
        exempt = evicting.get(info.namespace)
        if exempt is None or pod.ended_at is not None or info.ended or not self._holds_gpus(pod):
            return False
        priority_class = (info.raw.get("spec") or {}).get("priorityClassName")
        return priority_class != self.settings.over_budget_priority_class and not is_exempt(
            priority_class, info.namespace, exempt, self.settings.exempt_namespaces
        )

    async def _bound_terminations(self, evicting: dict[str, frozenset[str]], result: PassResult) -> None:
        """A pod being deleted runs until its deletion's grace ends, and a tenant chooses that grace with
        its own DELETE (a year, say), beyond its spec's: the scheduler waits for a terminating pod rather
        than preempt another, and `_downgrade` skips it. A GPU pod at the reduced class, or one due for
        downgrade, whose deletion ends more than `over_budget_max_grace_seconds` (and a minute's slack
        for clocks) from now is deleted again with that grace: the API server shortens a deletion's
        grace, never lengthens it."""
        cap = self.settings.over_budget_max_grace_seconds
        limit = self.clock.now() + timedelta(seconds=cap) + TERMINATION_SLACK
        for pod in self.registry.pods():
            info = pod.info
            ends = info.deleting_since  # the deletionTimestamp: when the grace ends
            if ends is None or ends <= limit or pod.ended_at is not None or info.ended:
                continue
            reduced = (info.raw.get("spec") or {}).get("priorityClassName") == (
                self.settings.over_budget_priority_class
            )
            if not (reduced and self._holds_gpus(pod)) and not self._above_reduced(pod, evicting):
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
                self.downgrade_metrics.pods.labels(outcome="grace_shortened").inc()
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
                if self._patience_spent(pods):
                    await asyncio.gather(*(self._delete(pod, result) for pod in pods))
                    return True
                self._blocked(info, result)
                return False
        # All at once: a controller recreating the first pod before the last is gone races the webhook,
        # whose view still holds the rest at the old class.
        await asyncio.gather(*(self._evict(pod, result) for pod in pods))
        return True

    def _patience_spent(self, pods: list[TrackedPod]) -> bool:
        patience = timedelta(seconds=self.settings.downgrade_pdb_patience_seconds)
        now = self.clock.now()
        return any(now - self._due_since.get(pod.info.uid, now) >= patience for pod in pods)

    def _blocked(self, info: PodInfo, result: PassResult) -> None:
        result.blocked.append((info.namespace, info.name))
        self.downgrade_metrics.pods.labels(outcome="blocked_by_pdb").inc()
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

    def _grace(self, info: PodInfo) -> int:
        """The grace a downgrade gives the pod: its own terminationGracePeriodSeconds, at most
        `over_budget_max_grace_seconds` (a pod admitted in budget may carry any, and it is immutable)."""
        own = (info.raw.get("spec") or {}).get("terminationGracePeriodSeconds")
        if not isinstance(own, int) or isinstance(own, bool) or own < 0:
            own = DEFAULT_TERMINATION_GRACE_SECONDS
        return min(own, self.settings.over_budget_max_grace_seconds)

    async def _evict(self, pod: TrackedPod, result: PassResult) -> None:
        info = pod.info
        outcome = await self.kube.evict_pod(info.namespace, info.name, grace_period_seconds=self._grace(info))
        if outcome is EvictionResult.BLOCKED_BY_PDB:
            self._blocked(info, result)
            return
        if outcome is EvictionResult.EVICTED:
            result.evicted.append((info.namespace, info.name))
            self.downgrade_metrics.pods.labels(outcome="evicted").inc()
            log.info("downgrade_evicted", extra={"namespace": info.namespace, "pod": info.name})
            await self._announce_downgrade(info, "evicted")

    async def _delete(self, pod: TrackedPod, result: PassResult) -> None:
        """The DELETE past the PDB patience, with the bounded grace, of this very pod (its uid)."""
        info = pod.info
        grace = self._grace(info)
        if not await self.kube.delete_pod(info.namespace, info.name, info.uid, grace):
            return
        result.deleted.append((info.namespace, info.name))
        self.downgrade_metrics.pods.labels(outcome="deleted_past_pdb").inc()
        log.warning(
            "downgrade_deleted_past_pdb",
            extra={
                "namespace": info.namespace,
                "pod": info.name,
                "grace_seconds": grace,
                "due_since": self._due_since.get(info.uid, self.clock.now()).isoformat(),
            },
        )
        await self._announce_downgrade(
            info,
            f"deleted after its PodDisruptionBudget refused eviction for "
            f"{self.settings.downgrade_pdb_patience_seconds:g} s",
        )

    async def _announce_downgrade(self, info: PodInfo, how: str) -> None:
        message = (
            f"{how}: namespace {info.namespace} has spent its GPU budget; its controller recreates "
            f"the pod at PriorityClass {self.settings.over_budget_priority_class}"
        )
        pod_ref = ObjectReference("Pod", info.name, info.namespace, uid=info.uid)
        await self._post_event(info.namespace, "GPUBudgetDowngrade", message, "Warning", pod_ref)
        await self._post_event(info.namespace, "GPUBudgetDowngrade", f"pod {info.name} {message}", "Normal")

    async def _apply_quotas(self, limits: dict[str, Decimal | None], result: PassResult) -> None:
        """Each namespace's concurrent GPU limit as our ResourceQuota; ours removed where no limit is."""
        try:
            managed = await self.kube.managed_quota_namespaces()
            for namespace in sorted(set(limits) | managed):
                limit = limits.get(namespace)
                if limit is not None:
                    hard = quota_hard(limit, self.hardware)
                    change = await self.kube.apply_resource_quota(namespace, hard)
                elif namespace in managed:
                    change = await self.kube.delete_resource_quota(namespace)
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
            await self.kube.post_event(namespace, reason, message, type_, involved)
        except KubeError as error:
            log.warning("event_failed", extra={"namespace": namespace, "reason": reason, "error": str(error)})


async def build_reconciler(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], clock: Clock
) -> Reconciler:
    """The scheduler's reconciler, with a client of its own (closed by `aclose`)."""
    kube = await KubeClient.from_config(KubeConfig.from_settings(settings))
    return Reconciler(kube, sessionmaker, settings, clock)
