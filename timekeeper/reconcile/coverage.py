"""What the pass records on each GPU pod's coverage row from the pod watch: its GPU model (billing
weights), its admitted share and its workload. Each set remembers the pods already recorded, so a pod
is written once; a pod without a row yet is tried again next pass."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from timekeeper.reconcile.pods import PodRegistry
from timekeeper.reconcile.repository import ReconcileRepository
from timekeeper.reconcile.result import PassResult
from timekeeper.reconcile.workloads import workload_key
from timekeeper.usage.admitted import NodeModels


class CoverageRecorder:
    """The models, shares and workloads of the registry's pods, written to their coverage rows."""

    def __init__(
        self,
        registry: PodRegistry,
        sessionmaker: async_sessionmaker[AsyncSession],
        node_models: NodeModels,
        cluster: str | None = None,
    ) -> None:
        self.registry = registry
        self.cluster = cluster  # whose pods the registry holds (None: the local cluster)
        self.sessionmaker = sessionmaker
        self.node_models = node_models
        self._modelled: set[str] = set()  # uids whose coverage row holds their GPU model
        self._shared: set[str] = set()  # uids whose coverage row holds their admitted share
        self._named: set[str] = set()  # uids whose coverage row holds their workload (or bare pods)

    def forget(self) -> None:
        self._modelled = set()
        self._shared = set()
        self._named = set()

    async def learn_models(self, result: PassResult) -> None:
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
            model = await self.node_models.model(node) if node else None
            if model is not None:
                models[uid] = model
        if models:
            async with self.sessionmaker() as session, session.begin():
                known = await ReconcileRepository(session, self.cluster).record_models(models)
            self._modelled |= known
            result.modelled = len(known)

    async def learn_shares(self) -> None:
        """Each GPU pod's admitted share, recorded on its coverage row, so that its reports are charged at
        it whatever share they state (static auth mode reads no pod itself); a pod without a row yet is
        tried again next pass."""
        pods = self.registry.pods()
        self._shared &= {pod.info.uid for pod in pods}
        shares = {pod.info.uid: pod.share for pod in pods if pod.info.uid not in self._shared}
        if shares:
            async with self.sessionmaker() as session, session.begin():
                self._shared |= await ReconcileRepository(session, self.cluster).record_admitted_shares(
                    shares
                )

    async def learn_workloads(self) -> None:
        """Each GPU pod's workload recorded on its coverage row, for usage by workload (a bare pod has
        none: it counts as itself); a pod without a row yet is tried again next pass."""
        pods = self.registry.pods()
        self._named &= {pod.info.uid for pod in pods}
        keys = {pod.info.uid: workload_key(pod.info)[1] for pod in pods if pod.info.uid not in self._named}
        self._named |= {uid for uid, key in keys.items() if key.startswith("Pod/")}
        named = {uid: key for uid, key in keys.items() if not key.startswith("Pod/")}
        if named:
            async with self.sessionmaker() as session, session.begin():
                self._named |= await ReconcileRepository(session, self.cluster).record_workloads(named)
