"""Every GPU and MIG device of the node through NVML: measurements, compute processes (host PIDs) and their
SM utilisation (not offered on MIG). A device's error stays its own: a lost GPU reads `lost` and the
library is re-initialised, at most every `reinit_seconds`, until it answers."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from gpuaccounting.nvmlerrors import classify
from gpuaccounting.wire import GpuStatus
from gpunvml import ComputeProcesses, NvmlUnavailable, open_nvml, shutdown


class _Lost(Exception):
    pass


@dataclass(slots=True)
class DeviceReading:
    """One device at one instant. `processes`: host PID -> GPU memory; `process_sm_util`: host PID -> SM
    utilisation since the previous reading (None where NVML cannot attribute utilisation)."""

    uuid: str
    status: GpuStatus = "ok"
    name: str | None = None
    parent_uuid: str | None = None
    sm_util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    energy_millijoules: int | None = None
    processes: dict[int, int] | None = None
    process_sm_util: dict[int, float] | None = None


@dataclass(slots=True)
class _Device:
    uuid: str
    handle: Any
    name: str | None
    parent_uuid: str | None
    is_mig: bool
    unsupported: set[str] = field(default_factory=set)
    last_seen_us: int = 0


class NodeNvml:
    """Reads all of the node's devices; `read()` once per sample tick."""

    def __init__(
        self,
        library: Path | None,
        reinit_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._library = library
        self._reinit = reinit_seconds
        self._clock = clock
        self._nvml: ModuleType | None = None
        self._devices: list[_Device] = []
        self._lost: set[str] = set()
        self._incomplete = False
        self._opened_at = 0.0
        self._processes = ComputeProcesses()

    def open(self) -> str:
        self._nvml, version = open_nvml(self._library)
        self._opened_at = self._clock()
        self._enumerate()
        return version

    def close(self) -> None:
        if self._nvml is not None:
            nvml, self._nvml = self._nvml, None
            shutdown(nvml)

    def _process_list(self, handle: Any) -> list[Any]:
        assert self._nvml is not None
        return self._processes(self._nvml, handle)

    def _enumerate(self) -> None:
        nvml = self._nvml
        assert nvml is not None
        devices: list[_Device] = []
        self._incomplete = False
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                gpu = nvml.nvmlDeviceGetHandleByIndex(index)
                gpu_uuid = str(nvml.nvmlDeviceGetUUID(gpu))
            except nvml.NVMLError as error:
                if classify(error) == "fatal":
                    raise NvmlUnavailable(str(error)) from None
                self._incomplete = True
                continue
            children = self._mig_children(gpu)
            if not children:
                devices.append(_Device(gpu_uuid, gpu, self._name(gpu), None, is_mig=False))
            for child in children:
                with contextlib.suppress(nvml.NVMLError):
                    devices.append(
                        _Device(str(nvml.nvmlDeviceGetUUID(child)), child, self._name(child), gpu_uuid, True)
                    )
        known = {device.uuid for device in devices}
        self._lost = {uuid for uuid in self._lost if uuid not in known}
        self._devices = devices

    def _name(self, handle: Any) -> str | None:
        assert self._nvml is not None
        with contextlib.suppress(self._nvml.NVMLError):
            return str(self._nvml.nvmlDeviceGetName(handle))
        return None

    def _mig_children(self, gpu: Any) -> list[Any]:
        nvml = self._nvml
        assert nvml is not None
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(gpu)
        except nvml.NVMLError:
            return []
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        children = []
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
            with contextlib.suppress(nvml.NVMLError):
                children.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot))
        return children

    def _call(self, device: _Device, figure: str, call: Callable[..., Any], *args: Any) -> Any:
        """One measurement: None when not supported here (remembered); raises _Lost for a lost device."""
        assert self._nvml is not None
        if figure in device.unsupported:
            return None
        try:
            return call(device.handle, *args)
        except (self._nvml.NVMLError, self._nvml.NVMLLibraryMismatchError) as error:
            outcome = classify(error)
            if outcome == "absent":
                device.unsupported.add(figure)
                return None
            if outcome == "fatal":
                raise NvmlUnavailable(str(error)) from None
            raise _Lost(str(error)) from None

    def _process_util(self, device: _Device) -> dict[int, float] | None:
        """Each process's mean SM utilisation over the samples NVML took since the last reading."""
        nvml = self._nvml
        assert nvml is not None
        if device.is_mig or "process_util" in device.unsupported:
            return None
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(device.handle, device.last_seen_us)
        except nvml.NVMLError_NotFound:
            return {}  # no sample since the last reading: nothing ran
        except nvml.NVMLError as error:
            if classify(error) == "absent":
                device.unsupported.add("process_util")
                return None
            raise _Lost(str(error)) from None
        totals: dict[int, list[float]] = {}
        for sample in samples:
            totals.setdefault(int(sample.pid), []).append(float(sample.smUtil))
            device.last_seen_us = max(device.last_seen_us, int(sample.timeStamp))
        return {pid: sum(values) / len(values) for pid, values in totals.items()}

    def _read_one(self, device: _Device) -> DeviceReading:
        nvml = self._nvml
        assert nvml is not None
        reading = DeviceReading(device.uuid, name=device.name, parent_uuid=device.parent_uuid)
        if device.uuid in self._lost:
            reading.status = "lost"
            return reading
        try:
            utilization = self._call(device, "utilization", nvml.nvmlDeviceGetUtilizationRates)
            memory = self._call(device, "memory", nvml.nvmlDeviceGetMemoryInfo)
            energy = self._call(device, "energy", nvml.nvmlDeviceGetTotalEnergyConsumption)
            processes = self._call(device, "processes", self._process_list)
            process_util = self._process_util(device)
        except _Lost:
            self._lost.add(device.uuid)
            reading.status = "lost"
            return reading
        reading.sm_util_pct = float(utilization.gpu) if utilization is not None else None
        reading.mem_used_bytes = int(memory.used) if memory is not None else None
        reading.mem_total_bytes = int(memory.total) if memory is not None else None
        reading.energy_millijoules = int(energy) if energy is not None else None
        if processes is not None:
            reading.processes = {int(p.pid): int(p.usedGpuMemory or 0) for p in processes}
        reading.process_sm_util = process_util
        if device.unsupported - {"process_util"}:
            reading.status = "partial"
        return reading

    def read(self) -> list[DeviceReading]:
        """Every device now; lost ones as `lost` until a re-initialisation finds them answering."""
        if self._nvml is None:
            self.open()
        elif (self._lost or self._incomplete) and self._clock() - self._opened_at >= self._reinit:
            self.close()
            self.open()
        readings = [self._read_one(device) for device in self._devices]
        known = {device.uuid for device in self._devices}
        readings += [DeviceReading(uuid, status="lost") for uuid in sorted(self._lost - known)]
        return readings
