"""A namespace's concurrent GPU limit in each sharing system's own units, as a ResourceQuota's `hard`."""

from __future__ import annotations

import math
from decimal import Decimal

from gpuaccounting.shares import GpuHardware


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
