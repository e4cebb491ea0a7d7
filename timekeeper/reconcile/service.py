"""The reconciler, the periodic `reconcile` job, run by the elected leader alone: its watches feed the
registries (reconcile/watches.py) and each pass charges silent time through `IngestService.charge`
(reconcile/charging.py: reports and passes never charge the same time twice), closes out ended pods,
counts silent sidecars (census.py), downgrades (decisions.py, downgrades.py) and applies quotas. This
class only composes those parts, in the order a pass runs them.

A fleet's hub runs one Reconciler per cluster (`build_reconcilers`): its own, and each member's through
that member's API server, each with its own client, watches and registries and its own job, so a member
whose API server is away fails its own passes only. Each reads and writes the store under its cluster's
namespace and pod keys (timekeeper/domain/clusters.py) and acts in its cluster on its bare names."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from timekeeper.auth.kubernetes import ClusterIdentities, cluster_kube_configs
from timekeeper.budgets.pools.service import PoolService
from timekeeper.clock import Clock
from timekeeper.domain.clusters import in_cluster, namespace_key
from timekeeper.kube import KubeClient
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

__all__ = ["PassResult", "Reconciler", "Reconcilers", "build_reconcilers"]


class Reconciler:
    """The watches and caches, the charges, the decisions and the writes of one leader in one cluster,
    composed: `kube` reaches `cluster`'s API server (None: the local cluster). The metrics are given
    where several clusters' reconcilers export them together."""

    def __init__(
        self,
        kube: KubeClient,
        sessionmaker: async_sessionmaker[AsyncSession],
        settings: Settings,
        clock: Clock,
        cluster: str | None = None,
        pod_metrics: PodWatchCollector | None = None,
        downgrade_metrics: DowngradeMetrics | None = None,
        identities: ClusterIdentities | None = None,
    ) -> None:
        self.kube = kube
        self.cluster = cluster
        self.identities = identities
        self.sessionmaker = sessionmaker
        self.clock = clock
        self.downgrade_metrics = downgrade_metrics or DowngradeMetrics()
        self.kueue = KueuePriorities(kube, sessionmaker, settings, clock, self.downgrade_metrics, cluster)
        self.watches = Watches(kube, settings, clock, self.kueue)
        self.registry: PodRegistry = self.watches.pods
        self.claims: ClaimRegistry = self.watches.claims
        self._node_models = NodeModels(kube, clock)
        self.coverage = CoverageRecorder(self.registry, sessionmaker, self._node_models, cluster)
        self.charger = SilentCharger(
            kube, self.registry, self.claims, sessionmaker, settings, clock, self._node_models, cluster
        )
        self.census = PodCensus(self.registry, settings, clock, pod_metrics or PodWatchCollector(), cluster)
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
        if self.identities is not None:
            # A member that is another cluster under a second name (docs/fleet.md) is refused here as on
            # requests: its pass would charge that cluster's pods twice and undo its quotas.
            await self.identities.admit(self.cluster)
        # First, and never caught: an API server that does not answer fails the pass before it charges
        # anything from what its watch last said (a pod that ended meanwhile would be charged as running).
        await self._sync_labels(result)
        await self.coverage.learn_models(result)
        await self.coverage.learn_shares()
        await self.coverage.learn_workloads()
        await self.charger.charge_claims(result)  # first: charge_pods forgets ended pods claims still need
        await self.charger.charge_pods(result)
        async with self.sessionmaker() as session:
            repository = ReconcileRepository(session, self.cluster)
            reports = await repository.sidecar_reports(
                p.info.uid for p in self.registry.pods() if p.running and p.sidecar
            )
            # This cluster's namespaces only, by bare name: each cluster's keys are its own (docs/fleet.md).
            states = in_cluster(await repository.states(), self.cluster)
            evicting = in_cluster(await repository.evicting(), self.cluster)
            keys = {namespace_key(self.cluster, p.info.namespace) for p in self.registry.pods()}
            limits = in_cluster(await repository.concurrent_limits(keys), self.cluster)
        holders = self.charger.claim_holders
        self.census.count(reports, holders, result)
        await self.announcer.announce_states(states, result)
        await self.downgrader.downgrade(evicting, holders, result)
        await self.downgrader.bound_terminations(evicting, holders, result)
        await self.kueue.run(result.kueue_lowered, result.kueue_restored)
        await apply_quotas(self.kube, limits, self.settings.hardware, result)
        return result

    async def _sync_labels(self, result: PassResult) -> None:
        """This cluster's namespaces' labels, under their keys, for the pools' selectors
        (docs/timekeeper.md#pools)."""
        labels = await self.kube.namespace_labels()
        async with self.sessionmaker() as session, session.begin():
            pools = PoolService(session, self.settings, self.clock)
            result.pool_moves = await pools.sync_labels(labels, self.cluster)


@dataclass(frozen=True, slots=True)
class Reconcilers:
    """One Reconciler per cluster, the local one first, and the metrics they all export."""

    clusters: tuple[Reconciler, ...]
    pod_metrics: PodWatchCollector
    downgrade_metrics: DowngradeMetrics


async def build_reconcilers(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], clock: Clock
) -> Reconcilers:
    """The periodic jobs' reconcilers: the local cluster's and each member's (docs/fleet.md), each with a
    client of its own (closed by its `aclose`), a member's through its kubeconfig."""
    pod_metrics, downgrade_metrics = PodWatchCollector(), DowngradeMetrics()
    built: list[Reconciler] = []
    try:
        clients = {
            cluster: await KubeClient.from_config(config)
            for cluster, config in cluster_kube_configs(settings).items()
        }
        identities = ClusterIdentities.of(clients) if settings.members else None
        for cluster, kube in clients.items():
            built.append(
                Reconciler(
                    kube, sessionmaker, settings, clock, cluster, pod_metrics, downgrade_metrics, identities
                )
            )
    except BaseException:
        for reconciler in built:
            await reconciler.kube.close()
        raise
    return Reconcilers(tuple(built), pod_metrics, downgrade_metrics)
