"""Per-interval aggregates of the samples, and the merge of several intervals' figures into one.

Utilisation: mean and max over the interval's samples; memory: the maximum used; energy: the counter's
growth over the interval (in joules). A figure no sample could give stays None.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuaccounting.wire import GpuFigures
from sidecar.gpus import GpuSample


def _max(values: Iterable[float | int | None]) -> float | int | None:
    present = [value for value in values if value is not None]
    return max(present) if present else None


@dataclass(slots=True)
class _Running:
    util_sum: float = 0.0
    util_count: int = 0
    util_max: float | None = None
    mem_used_max: int | None = None
    mem_total: int | None = None
    energy_last: int | None = None
    processes_max: int | None = None


class IntervalAggregate:
    """Folds samples into the figures of the interval being measured; `cut()` closes it."""

    def __init__(self) -> None:
        self._running: dict[str, _Running] = {}
        # The energy counter's reading at the end of the previous interval, per GPU.
        self._energy_base: dict[str, int] = {}
        self._energy_first: dict[str, int] = {}

    def add(self, samples: Iterable[GpuSample]) -> None:
        for sample in samples:
            running = self._running.setdefault(sample.uuid, _Running())
            if sample.sm_util_pct is not None:
                running.util_sum += sample.sm_util_pct
                running.util_count += 1
                running.util_max = _max((running.util_max, sample.sm_util_pct))
            running.mem_used_max = _max((running.mem_used_max, sample.mem_used_bytes))  # type: ignore[assignment]
            running.mem_total = _max((running.mem_total, sample.mem_total_bytes))  # type: ignore[assignment]
            running.processes_max = _max((running.processes_max, sample.process_count))  # type: ignore[assignment]
            if sample.energy_millijoules is not None:
                self._energy_first.setdefault(sample.uuid, sample.energy_millijoules)
                running.energy_last = sample.energy_millijoules

    def _energy_joules(self, uuid: str, running: _Running) -> float | None:
        if running.energy_last is None:
            return None
        base = self._energy_base.get(uuid, self._energy_first[uuid])
        self._energy_base[uuid] = running.energy_last
        # A counter that went backwards was reset (GPU reset, driver reload): this interval cannot say.
        return (running.energy_last - base) / 1000 if running.energy_last >= base else None

    def cut(self) -> list[GpuFigures]:
        """The interval's figures, one entry per GPU seen; starts the next interval empty."""
        figures = [
            GpuFigures(
                uuid=uuid,
                sm_util_pct=round(running.util_sum / running.util_count, 3) if running.util_count else None,
                mem_used_bytes=running.mem_used_max,
                mem_total_bytes=running.mem_total,
                sm_util_max_pct=running.util_max,
                energy_joules=self._energy_joules(uuid, running),
            )
            for uuid, running in self._running.items()
        ]
        self._running = {}
        self._energy_first = {}
        return figures

    def processes_max(self) -> dict[str, int | None]:
        """The most compute processes seen per GPU so far this interval (for the debug log)."""
        return {uuid: running.processes_max for uuid, running in self._running.items()}


def merge_figures(parts: list[tuple[int, list[GpuFigures]]]) -> list[GpuFigures]:
    """Figures of several contiguous intervals as one: utilisation weighted by each interval's length."""
    merged: dict[str, list[tuple[int, GpuFigures]]] = {}
    for duration, figures in parts:
        for figure in figures:
            merged.setdefault(figure["uuid"], []).append((duration, figure))
    result: list[GpuFigures] = []
    for uuid, entries in merged.items():
        weighted = [(d, f["sm_util_pct"]) for d, f in entries if f["sm_util_pct"] is not None]
        weight = sum(d for d, _ in weighted)
        energies = [f.get("energy_joules") for _, f in entries if f.get("energy_joules") is not None]
        result.append(
            GpuFigures(
                uuid=uuid,
                sm_util_pct=(
                    round(sum(d * u for d, u in weighted) / weight, 3) if weighted and weight else None  # type: ignore[operator]
                ),
                mem_used_bytes=_max(f["mem_used_bytes"] for _, f in entries),  # type: ignore[typeddict-item]
                mem_total_bytes=_max(f["mem_total_bytes"] for _, f in entries),  # type: ignore[typeddict-item]
                sm_util_max_pct=_max(f.get("sm_util_max_pct") for _, f in entries),
                energy_joules=sum(energies) if energies else None,  # type: ignore[arg-type]
            )
        )
    return result
