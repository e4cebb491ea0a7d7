"""Per-interval aggregates of the samples, and the merge of several intervals' into one: utilisation mean and
max, memory's maximum, energy's growth in joules; what no sample could give stays None."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuaccounting.wire import GpuMeasurements, GpuStatus, compact_measurements, worst_status
from sidecar.gpus import GpuSample


def _max(values: Iterable[float | int | None]) -> float | int | None:
    present = [value for value in values if value is not None]
    return max(present) if present else None


@dataclass(slots=True)
class _Mean:
    """Mean and maximum of the samples that had a value."""

    total: float = 0.0
    count: int = 0
    peak: float | None = None

    def add(self, value: float | None) -> None:
        if value is not None:
            self.total += value
            self.count += 1
            self.peak = value if self.peak is None else max(self.peak, value)

    def mean(self) -> float | None:
        return round(self.total / self.count, 3) if self.count else None


@dataclass(slots=True)
class _Running:
    util: _Mean = field(default_factory=_Mean)
    pod_util: _Mean = field(default_factory=_Mean)
    mem_used_max: int | None = None
    mem_total: int | None = None
    energy_last: int | None = None
    processes_max: int | None = None
    pod_mem_used_max: int | None = None
    pod_processes_max: int | None = None
    statuses: set[GpuStatus] = field(default_factory=set)
    name: str | None = None
    parent_uuid: str | None = None


class IntervalAggregate:
    """Folds samples into the measurements of the interval being measured; `cut()` closes it."""

    def __init__(self) -> None:
        self._running: dict[str, _Running] = {}
        # The energy counter's reading at the end of the previous interval, per GPU.
        self._energy_base: dict[str, int] = {}
        self._energy_first: dict[str, int] = {}

    def add(self, samples: Iterable[GpuSample]) -> None:
        for sample in samples:
            running = self._running.setdefault(sample.uuid, _Running())
            running.util.add(sample.sm_util_pct)
            running.pod_util.add(sample.pod_sm_util_pct)
            running.statuses.add(sample.status)
            running.name = sample.name or running.name
            running.parent_uuid = sample.parent_uuid or running.parent_uuid
            running.pod_mem_used_max = _max((running.pod_mem_used_max, sample.pod_mem_used_bytes))  # type: ignore[assignment]
            running.pod_processes_max = _max((running.pod_processes_max, sample.pod_process_count))  # type: ignore[assignment]
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

    def cut(self) -> list[GpuMeasurements]:
        """The interval's measurements, one entry per GPU seen; starts the next interval empty."""
        figures = [
            compact_measurements(
                GpuMeasurements(
                    uuid=uuid,
                    sm_util_pct=running.util.mean(),
                    mem_used_bytes=running.mem_used_max,
                    mem_total_bytes=running.mem_total,
                    sm_util_max_pct=running.util.peak,
                    energy_joules=self._energy_joules(uuid, running),
                    status=worst_status(sorted(running.statuses)),
                    name=running.name,
                    parent_uuid=running.parent_uuid,
                    pod_sm_util_pct=running.pod_util.mean(),
                    pod_sm_util_max_pct=running.pod_util.peak,
                    pod_mem_used_bytes=running.pod_mem_used_max,
                    pod_processes=running.pod_processes_max,
                )
            )
            for uuid, running in self._running.items()
        ]
        self._running = {}
        self._energy_first = {}
        return figures

    def processes_max(self) -> dict[str, int | None]:
        """The most compute processes seen per GPU so far this interval (for the debug log)."""
        return {uuid: running.processes_max for uuid, running in self._running.items()}


def _weighted_mean(entries: list[tuple[int, GpuMeasurements]], key: str) -> float | None:
    """The mean of one measurement over several intervals, each weighted by its length."""
    weighted = [(d, f.get(key)) for d, f in entries if f.get(key) is not None]
    weight = sum(d for d, _ in weighted)
    return round(sum(d * u for d, u in weighted) / weight, 3) if weighted and weight else None  # type: ignore[operator,misc]


def merge_measurements(parts: list[tuple[int, list[GpuMeasurements]]]) -> list[GpuMeasurements]:
    """Measurements of several contiguous intervals as one: utilisation weighted by each interval's length,
    maxima kept, energy summed, the worst status kept."""
    merged: dict[str, list[tuple[int, GpuMeasurements]]] = {}
    for duration, figures in parts:
        for figure in figures:
            merged.setdefault(figure["uuid"], []).append((duration, figure))
    result: list[GpuMeasurements] = []
    for uuid, entries in merged.items():
        energies = [f.get("energy_joules") for _, f in entries if f.get("energy_joules") is not None]
        entry = GpuMeasurements(
            uuid=uuid,
            sm_util_pct=_weighted_mean(entries, "sm_util_pct"),
            mem_used_bytes=_max(f["mem_used_bytes"] for _, f in entries),  # type: ignore[typeddict-item]
            mem_total_bytes=_max(f["mem_total_bytes"] for _, f in entries),  # type: ignore[typeddict-item]
            sm_util_max_pct=_max(f.get("sm_util_max_pct") for _, f in entries),
            energy_joules=sum(energies) if energies else None,  # type: ignore[arg-type]
            status=worst_status([f.get("status", "ok") for _, f in entries]),
            name=next((f.get("name") for _, f in entries if f.get("name")), None),
            parent_uuid=next((f.get("parent_uuid") for _, f in entries if f.get("parent_uuid")), None),
            pod_sm_util_pct=_weighted_mean(entries, "pod_sm_util_pct"),
            pod_sm_util_max_pct=_max(f.get("pod_sm_util_max_pct") for _, f in entries),
            pod_mem_used_bytes=_max(f.get("pod_mem_used_bytes") for _, f in entries),  # type: ignore[typeddict-item]
            pod_processes=_max(f.get("pod_processes") for _, f in entries),  # type: ignore[typeddict-item]
        )
        result.append(compact_measurements(entry))
    return result
