"""The measurements' sums, decided without the database. Every one adds exactly, so the hourly
roll-up changes no answer: utilisation and memory as measurement x seconds beside the seconds that had it,
energy as mean power x the seconds charged, peaks as maxima, statuses as a bit per status seen."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any, Literal, TypeVar

from gpuaccounting.wire import GPU_STATUSES, GpuStatus

_T = TypeVar("_T", Decimal, int)
# How a usage answer groups its rows.
GroupBy = Literal["pod", "workload", "hour", "day", "model"]
_PCT = Decimal("0.001")
_JOULES = Decimal("0.001")


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
class MeasurementSums:
    """A usage row's measurements as the query adds them up; `+` folds two rows (the namespace's totals)."""

    util_seconds: Decimal | None
    util_covered_seconds: Decimal
    peak_sm_util_pct: Decimal | None
    mem_byte_seconds: Decimal | None
    mem_covered_seconds: Decimal
    peak_mem_used_bytes: int | None
    energy_joules: Decimal | None
    gpu_status_bits: int

    def __add__(self, other: MeasurementSums) -> MeasurementSums:
        return MeasurementSums(
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
        """The usage answer's measurement fields (a row's, or with prefix "total_" the namespace's)."""
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


NO_MEASUREMENTS = MeasurementSums(None, Decimal(0), None, None, Decimal(0), None, None, 0)


def _add(a: _T | None, b: _T | None) -> _T | None:
    return b if a is None else a if b is None else a + b


def _max(a: _T | None, b: _T | None) -> _T | None:
    return b if a is None else a if b is None else max(a, b)


def _mean(weighted: Decimal | None, seconds: Decimal) -> Decimal | None:
    return None if weighted is None or seconds == 0 else weighted / seconds


def _rounded(value: Decimal | None, step: Decimal) -> float | None:
    return None if value is None else float(value.quantize(step, ROUND_HALF_EVEN))
