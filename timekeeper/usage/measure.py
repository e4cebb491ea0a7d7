"""What one report contributes to the measurements, stored on its ledger row at ingest."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from timekeeper.domain.measurements import status_bits
from timekeeper.usage.schemas import GpuFiguresIn, ReportIn

_ONE_MICROSECOND = timedelta(microseconds=1)
_MICROSECONDS = Decimal(1_000_000)


def _own(pod_figure: float | None, device_figure: float | None) -> float | None:
    return pod_figure if pod_figure is not None else device_figure


def _own_peak(gpu: GpuFiguresIn) -> float | None:
    """The pod's own peak where the pod's utilisation is known (a shared device's peak is every tenant's),
    else the device's; a GPU that sent no peak peaks at its mean."""
    if gpu.pod_sm_util_pct is not None:
        return _own(gpu.pod_sm_util_max_pct, gpu.pod_sm_util_pct)
    return _own(gpu.sm_util_max_pct, gpu.sm_util_pct)


@dataclass(frozen=True, slots=True)
class Measured:
    """One report's measurements over the GPUs the sidecar could read, the pod's own where known."""

    mean_sm_util_pct: float | None  # mean over the GPUs
    peak_sm_util_pct: float | None  # largest over the GPUs
    mem_used_bytes: int | None  # the pod's memory on all its GPUs together
    mean_power_w: Decimal | None  # all its GPUs' energy over the interval's seconds
    gpu_status_bits: int


def measure(report: ReportIn) -> Measured:
    gpus = report.gpus
    utils = [u for gpu in gpus if (u := _own(gpu.pod_sm_util_pct, gpu.sm_util_pct)) is not None]
    peaks = [p for gpu in gpus if (p := _own_peak(gpu)) is not None]
    memory = [int(m) for gpu in gpus if (m := _own(gpu.pod_mem_used_bytes, gpu.mem_used_bytes)) is not None]
    energy = [gpu.energy_joules for gpu in gpus if gpu.energy_joules is not None]
    seconds = Decimal((report.interval_end - report.interval_start) // _ONE_MICROSECOND) / _MICROSECONDS
    return Measured(
        mean_sm_util_pct=sum(utils) / len(utils) if utils else None,
        peak_sm_util_pct=max(peaks) if peaks else None,
        mem_used_bytes=sum(memory) if memory else None,
        mean_power_w=sum(Decimal(str(e)) for e in energy) / seconds if energy else None,
        gpu_status_bits=status_bits([gpu.status for gpu in gpus if gpu.status is not None]),
    )
