"""The measured figures, decided without the database: what one report contributes (stored on its ledger
row at ingest), and the answer's means, peaks, energy and statuses from the sums the usage query adds up.

Every figure is kept as something that adds exactly, so the hourly roll-up changes no answer: utilisation
and memory as figure x seconds beside the seconds that had the figure (a report without one adds no time,
so it never drags a mean towards zero), energy as the report's mean power (its energy over its interval)
x the seconds charged in each bucket (time already charged by another report adds no energy, so nothing
is counted twice), peaks as maxima, statuses as a bit per status seen."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any, TypeVar

from gpuaccounting.wire import GPU_STATUSES, GpuStatus
from timekeeper.usage.schemas import GpuFiguresIn, ReportIn

_T = TypeVar("_T", Decimal, int)
_ONE_MICROSECOND = timedelta(microseconds=1)
_MICROSECONDS = Decimal(1_000_000)
_PCT = Decimal("0.001")
_JOULES = Decimal("0.001")


def _own(pod_figure: float | None, device_figure: float | None) -> float | None:
    return pod_figure if pod_figure is not None else device_figure


def _own_peak(gpu: GpuFiguresIn) -> float | None:
    """The pod's own peak where the pod's utilisation is known (a shared device's peak is every tenant's),
    else the device's; a GPU that sent no peak peaks at its mean."""
    if gpu.pod_sm_util_pct is not None:
        return _own(gpu.pod_sm_util_max_pct, gpu.pod_sm_util_pct)
    return _own(gpu.sm_util_max_pct, gpu.sm_util_pct)


def status_bits(statuses: list[GpuStatus]) -> int:
    """The statuses as one integer with a bit per status (PostgreSQL folds them with bit_or)."""
    bits = 0
    for status in statuses:
        bits |= 1 << GPU_STATUSES.index(status)
    return bits


def statuses_of(bits: int) -> list[GpuStatus]:
    """The statuses a status_bits value holds, best first."""
    return [status for index, status in enumerate(GPU_STATUSES) if bits & (1 << index)]


@dataclass(frozen=True, slots=True)
class Measured:
    """One report's figures over the GPUs the sidecar could read, the pod's own where known."""

    gpu_count: int
    mean_sm_util_pct: float | None  # mean over the GPUs
    peak_sm_util_pct: float | None  # largest over the GPUs
    max_mem_used_bytes: int | None  # the most any one GPU held
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
        gpu_count=len(gpus),
        mean_sm_util_pct=sum(utils) / len(utils) if utils else None,
        peak_sm_util_pct=max(peaks) if peaks else None,
        max_mem_used_bytes=max(memory) if memory else None,
        mem_used_bytes=sum(memory) if memory else None,
        mean_power_w=sum(Decimal(str(e)) for e in energy) / seconds if energy else None,
        gpu_status_bits=status_bits([gpu.status for gpu in gpus if gpu.status is not None]),
    )


@dataclass(frozen=True, slots=True)
class FigureSums:
    """A usage row's figures as the query adds them up; `+` folds two rows (the namespace's totals)."""

    util_seconds: Decimal | None
    util_covered_seconds: Decimal
    peak_sm_util_pct: Decimal | None
    mem_byte_seconds: Decimal | None
    mem_covered_seconds: Decimal
    peak_mem_used_bytes: int | None
    energy_joules: Decimal | None
    gpu_status_bits: int

    def __add__(self, other: FigureSums) -> FigureSums:
        return FigureSums(
            _add(self.util_seconds, other.util_seconds),
            self.util_covered_seconds + other.util_covered_seconds,
            _max(self.peak_sm_util_pct, other.peak_sm_util_pct),
            _add(self.mem_byte_seconds, other.mem_byte_seconds),
            self.mem_covered_seconds + other.mem_covered_seconds,
            _max(self.peak_mem_used_bytes, other.peak_mem_used_bytes),
            _add(self.energy_joules, other.energy_joules),
            self.gpu_status_bits | other.gpu_status_bits,
        )

    def answer(self, prefix: str = "") -> dict[str, Any]:
        """The usage answer's figure fields (a row's, or with prefix "total_" the namespace's)."""
        mean_memory = _mean(self.mem_byte_seconds, self.mem_covered_seconds)
        whole_bytes = None if mean_memory is None else int(mean_memory.quantize(Decimal(1), ROUND_HALF_EVEN))
        fields = {
            "mean_sm_util_pct": _rounded(_mean(self.util_seconds, self.util_covered_seconds), _PCT),
            "peak_sm_util_pct": _rounded(self.peak_sm_util_pct, _PCT),
            "mean_mem_used_bytes": whole_bytes,
            "peak_mem_used_bytes": self.peak_mem_used_bytes,
            "energy_joules": _rounded(self.energy_joules, _JOULES),
            "gpu_statuses": statuses_of(self.gpu_status_bits),
        }
        return {prefix + name: value for name, value in fields.items()}


NO_FIGURES = FigureSums(None, Decimal(0), None, None, Decimal(0), None, None, 0)


def _add(a: _T | None, b: _T | None) -> _T | None:
    return b if a is None else a if b is None else a + b


def _max(a: _T | None, b: _T | None) -> _T | None:
    return b if a is None else a if b is None else max(a, b)


def _mean(weighted: Decimal | None, seconds: Decimal) -> Decimal | None:
    return None if weighted is None or seconds == 0 else weighted / seconds


def _rounded(value: Decimal | None, step: Decimal) -> float | None:
    return None if value is None else float(value.quantize(step, ROUND_HALF_EVEN))
