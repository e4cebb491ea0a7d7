"""The reconciler, the periodic `reconcile` job, run by the elected leader alone: its watches feed the
registries (reconcile/watches.py) and each pass charges silent time through `IngestService.charge`
(reconcile/charging.py: reports and passes never charge the same time twice), closes out ended pods,
counts silent sidecars (census.py), downgrades (decisions.py, downgrades.py) and applies quotas. This
class only composes those parts, in the order a pass runs them."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from timekeeper.budgets.pools.service import PoolService
from timekeeper.clock import Clock
from timekeeper.domain.clusters import in_cluster
from timekeeper.kube import KubeClient, KubeConfig
from timekeeper.metrics import DowngradeMetrics, PodWatchCollector
from timekeeper.reconcile.census import PodCensus
from timekeeper.reconcile.charging import SilentCharger
from timekeeper.reconcile.claims import ClaimRegistry
from timekeeper.reconcile.coverage import CoverageRecorder
from timekeeper.reconcile.downgrades import Downgrader
from timekeeper.reconcile.events import Announcer
from timekeeper.reconcile.kueue import KueuePriorities
from timekeeper.reconcile.pods import PodRegistry
from timekeeper.reconcile.quotas import apply_quotas
from timekeeper.reconcile.repository import ReconcileRepository
from timekeeper.reconcile.result import PassResult
from timekeeper.reconcile.watches import Watches
from timekeeper.settings import Settings
from timekeeper.usage.admitted import NodeModels

__all__ = ["PassResult", "Reconciler", "build_reconciler"]


class Reconciler:
    """The watches and caches, the charges, the decisions and the writes of one leader, composed."""

    def __init__(
        self,
        kube: KubeClient,
        sessionmaker: async_sessionmaker[AsyncSession],
        settings: Settings,
        clock: Clock,
    ) -> None:
        self.kube = kube
        self.sessionmaker = sessionmaker
        self.clock = clock
        self.downgrade_metrics = DowngradeMetrics()
        self.kueue = KueuePriorities(kube, sessionmaker, settings, clock, self.downgrade_metrics)
        self.watches = Watches(kube, settings, clock, self.kueue)
        self.registry: PodRegistry = self.watches.pods
        self.claims: ClaimRegistry = self.watches.claims
        self._node_models = NodeModels(kube, clock)
        self.coverage = CoverageRecorder(self.registry, sessionmaker, self._node_models)
        self.charger = SilentCharger(
            kube, self.registry, self.claims, sessionmaker, settings, clock, self._node_models
        )
        self.census = PodCensus(self.registry, settings, clock)
        self.announcer = Announcer(kube, settings)
        self.downgrader = Downgrader(
            kube, self.registry, settings, clock, self.downgrade_metrics, self.announcer
        )
        self.settings = settings

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        """New settings reach every part of the pass (tests turn its knobs between passes)."""
        self._settings = settings
        for part in (self.watches, self.charger, self.census, self.announcer, self.downgrader):
            part.settings = settings

    @property
    def pod_metrics(self) -> PodWatchCollector:
        return self.census.metrics

    # ---- leadership: the watches run only on the leader, whose passes they feed ------------------------

    @property
    def watching(self) -> bool:
        return self.watches.watching

    async def start_leading(self) -> None:
        """Emptied registries, filled by the watches' first lists and kept current by them (tasks on
        this loop). The states are learnt anew, so a change of leader does not repeat old news."""
        self.announcer.forget()
        self._forget_pods()
        self.watches.start()

    async def stop_leading(self) -> None:
        """Cancel the watches: their open requests end with the tasks, nothing is left waiting (the next
        leader lists the pods and claims itself). The client stays open for next time."""
        self._forget_pods()
        await self.watches.stop()

    def _forget_pods(self) -> None:
        """Not leading (or not yet passed): no pod counts are exported, so only the leader's show."""
        self.census.forget()
        self.coverage.forget()
        self.charger.forget()
        self._node_models.forget()
        self.downgrader.forget()
        self.kueue.forget()

    async def aclose(self) -> None:
        await self.stop_leading()
        await self.kube.close()

    async def wait_synced(self) -> None:
        """Before a pass: the registry must hold a full list (a new leader's watch has just started)."""
        await self.watches.wait_synced()

    # ---- one pass ----------------------------------------------------------------------------------------

    async def run_pass(self) -> PassResult:
        """One reconcile pass. Only the periodic jobs' leader runs it (the `reconcile` job), one window at a
        time: the election and the window's job_runs row are the one mechanism, no lock of its own."""
        result = PassResult()
        await self.coverage.learn_models(result)
        await self.coverage.learn_shares()
        await self.coverage.learn_workloads()
        await self.charger.charge_claims(result)  # first: charge_pods forgets ended pods claims still need
        await self.charger.charge_pods(result)
        await self._sync_labels(result)
        async with self.sessionmaker() as session:
            repository = ReconcileRepository(session)
            reports = await repository.sidecar_reports(
                p.info.uid for p in self.registry.pods() if p.running and p.sidecar
            )
            # This cluster's namespaces only: a fleet's members' keys are their clusters' (docs/fleet.md).
            states = in_cluster(await repository.states(), None)
            evicting = in_cluster(await repository.evicting(), None)
            namespaces = {p.info.namespace for p in self.registry.pods()}
            limits = in_cluster(await repository.concurrent_limits(namespaces), None)
        holders = self.charger.claim_holders
        self.census.count(reports, holders, result)
        await self.announcer.announce_states(states, result)
        await self.downgrader.downgrade(evicting, holders, result)
        await self.downgrader.bound_terminations(evicting, holders, result)
        await self.kueue.run(result.kueue_lowered, result.kueue_restored)
        await apply_quotas(self.kube, limits, self.settings.hardware, result)
        return result

    async def _sync_labels(self, result: PassResult) -> None:
        """The namespaces' labels, for the pools' selectors (docs/timekeeper.md#pools)."""
        labels = await self.kube.namespace_labels()
        async with self.sessionmaker() as session, session.begin():
            result.pool_moves = await PoolService(session, self.settings, self.clock).sync_labels(labels)


async def build_reconciler(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], clock: Clock
) -> Reconciler:
    """The periodic jobs' reconciler, with a client of its own (closed by `aclose`)."""
    kube = await KubeClient.from_config(KubeConfig.from_settings(settings))
    return Reconciler(kube, sessionmaker, settings, clock)
