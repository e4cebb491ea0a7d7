"""A namespace's concurrent GPU limit in each sharing system's own units, as a ResourceQuota's `hard`,
and the pass's write of every namespace's quota."""

from __future__ import annotations

import logging
import math
from decimal import Decimal

from gpuaccounting.shares import GpuHardware
from timekeeper.kube import KubeClient, KubeError, QuotaChange
from timekeeper.reconcile.result import PassResult

log = logging.getLogger(__name__)


def quota_hard(limit_gpus: Decimal, hardware: GpuHardware) -> dict[str, str]:
    """`requests.<resource>` for every resource that expresses a share as a count of units (extended
    resources can only be quota'd on requests). Each is capped independently: a quota cannot add up
    different resources, so a namespace mixing sharing systems could hold the limit in each."""
    limit = Decimal(limit_gpus)

    def units(per_gpu: Decimal | int) -> str:
        return str(math.floor(limit * Decimal(per_gpu)))

    return {
        "requests.nvidia.com/gpu": units(hardware.time_slicing_replicas),
        "requests.tencent.com/vcuda-core": units(100),
        "requests.cnvrg.io/metagpu": units(hardware.metagpu_units_per_gpu),
        "requests.aliyun.com/gpu-mem": units(
            Decimal(hardware.gpu_memory_mib) / Decimal(hardware.gpushare_memory_unit_mib)
        ),
    }


async def apply_quotas(
    kube: KubeClient, limits: dict[str, Decimal | None], hardware: GpuHardware, result: PassResult
) -> None:
    """Each namespace's concurrent GPU limit as our ResourceQuota; ours removed where no limit is."""
    try:
        managed = await kube.managed_quota_namespaces()
        for namespace in sorted(set(limits) | managed):
            limit = limits.get(namespace)
            if limit is not None:
                change = await kube.apply_resource_quota(namespace, quota_hard(limit, hardware))
            elif namespace in managed:
                change = await kube.delete_resource_quota(namespace)
            else:
                continue
            if change is not QuotaChange.UNCHANGED:
                result.quotas[namespace] = change
                log.info("quota_applied", extra={"namespace": namespace, "change": change.value})
    except KubeError as error:
        log.warning("quota_failed", extra={"error": str(error)})
