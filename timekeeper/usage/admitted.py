"""The GPU share a pod was admitted at (the webhook's annotation, which users may not change, else its GPU
requests) and its node's GPU model (GPU Feature Discovery's label): what its time is charged at and
weighted by, never a share or a model its reports state. Imported only where the timekeeper talks to the
cluster: the reconciler, and the report path in Kubernetes auth mode."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation

from gpuaccounting.dra import claim_refs
from gpuaccounting.names import ANNOTATION_GPU_SHARE, SIDECAR_CONTAINER_NAME
from gpuaccounting.shares import GpuHardware, read_pod
from timekeeper.auth.base import PodIdentity
from timekeeper.auth.kubernetes import member_kube_config
from timekeeper.clock import Clock
from timekeeper.domain.weights import model_key
from timekeeper.errors import TimekeeperError
from timekeeper.kube import KubeClient, KubeConfig, KubeError, PodInfo
from timekeeper.settings import Settings
from timekeeper.usage.service import PodFacts

log = logging.getLogger(__name__)

# GPU Feature Discovery's label naming the node's GPU model (with the MIG profile under the single strategy).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
NODE_LABEL_TTL = timedelta(minutes=10)


def admitted_share(pod: PodInfo, hardware: GpuHardware) -> Decimal | None:
    """The webhook's recorded share, else (missing, not positive, or a pod with DRA claims, whose GPUs are
    their claims' charge: reconcile/claims.py) what its own GPU requests come to. None: no GPU outside
    claims."""
    recorded = None if claim_refs(pod.raw) else pod.annotations.get(ANNOTATION_GPU_SHARE)
    if recorded is not None:
        try:
            share = Decimal(recorded)
        except InvalidOperation:
            share = None
        if share is not None and share.is_finite() and share > 0:
            return share
    computed = read_pod(pod.raw, hardware, skip_container=SIDECAR_CONTAINER_NAME)
    if not computed.uses_gpu or computed.share <= 0:
        return None
    return Decimal(computed.share.numerator) / Decimal(computed.share.denominator)


class NodeModels:
    """Each node's GPU model, from its `nvidia.com/gpu.product` label, read at most once per NODE_LABEL_TTL
    (RBAC: get nodes). Only an admin or the node's GPU Feature Discovery writes a node's labels; None where
    the node does not say (docs/billing.md)."""

    def __init__(self, kube: KubeClient, clock: Clock) -> None:
        self._kube = kube
        self._clock = clock
        self._models: dict[str, tuple[str | None, datetime]] = {}  # node -> (model, read at)

    async def model(self, node: str) -> str | None:
        """The node's model; an API server that cannot answer leaves the last one read (None at first)."""
        now = self._clock.now()
        cached = self._models.get(node)
        if cached is not None and now - cached[1] < NODE_LABEL_TTL:
            return cached[0]
        try:
            product = (await self._kube.node_labels(node)).get(GPU_PRODUCT_LABEL)
        except KubeError as error:
            log.warning("node_labels_unavailable", extra={"node": node, "error": str(error)})
            return None if cached is None else cached[0]
        model = model_key(product) if product else None
        self._models[node] = (model, now)
        return model

    def forget(self) -> None:
        self._models = {}


class PodShares:
    """Reads a pod's admitted share and its node's model from the API server, for a pod's first report (the
    pods table keeps both from then on). The report's token is bound to the pod, so the pod read is the
    one that reports."""

    def __init__(self, kube: KubeClient, hardware: GpuHardware, clock: Clock) -> None:
        self._kube = kube
        self._hardware = hardware
        self._nodes = NodeModels(kube, clock)

    async def admitted(self, pod: PodIdentity) -> PodFacts:
        """The pod's admitted share (0: it holds no GPU) and its node's model. An API server that cannot
        answer is a 503, so the sidecar retries later rather than the report being charged at a share it
        states; a pod that is gone is a 409 (the reconciler charges its time from the pod watch)."""
        try:
            found = await self._kube.read_pod(pod.namespace, pod.name)
        except KubeError as error:
            log.warning(
                "admitted_share_unavailable",
                extra={"namespace": pod.namespace, "pod": pod.name, "error": str(error)},
            )
            raise TimekeeperError(
                "the Kubernetes API cannot be read for the pod's admitted GPU share now; retry later", 503
            ) from error
        if found is None or found.uid != pod.uid:
            raise TimekeeperError(
                f"pod {pod.namespace}/{pod.name} (uid {pod.uid}) is gone: the GPU share it was admitted at "
                "cannot be read",
                409,
            )
        model = await self._nodes.model(found.node_name) if found.node_name else None
        return PodFacts(admitted_share(found, self._hardware) or Decimal(0), model)

    async def aclose(self) -> None:
        await self._kube.close()


async def build_pod_shares(settings: Settings, clock: Clock) -> dict[str | None, PodShares]:
    """The report path's readers (Kubernetes auth mode), each with a client of its own, built in the
    lifespan: the local cluster's (under None) and each member's, through its kubeconfig, so a member's pod
    is read where its token was bound to it (docs/fleet.md)."""
    readers: dict[str | None, PodShares] = {}
    try:
        kube = await KubeClient.from_config(KubeConfig.from_settings(settings))
        readers[None] = PodShares(kube, settings.hardware, clock)
        for name in settings.members:
            member = await KubeClient.from_config(member_kube_config(settings, name))
            readers[name] = PodShares(member, settings.hardware, clock)
    except BaseException:
        for reader in readers.values():
            await reader.aclose()
        raise
    return readers
