"""The real backend: NVML through NVIDIA's pynvml, one device's errors kept to that device; loading the
library (SIDECAR_NVML_LIBRARY) is `gpunvml`'s, shared with the node agent."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from gpuaccounting.nvmlerrors import LOST, classify, error_name
from gpuaccounting.wire import GpuStatus
from gpunvml import ComputeProcesses, NvmlUnavailable, open_nvml, shutdown
from sidecar.gpus import FIELDS, BackendUnavailable, Device, DeviceLost, GpuSample, Resolution, Selector


class PynvmlBackend:
    """GPU measurements from NVML; construct freely, nothing is loaded until `open`."""

    def __init__(self, library: Path | None = None) -> None:
        self._library = library
        self._nvml: ModuleType | None = None
        self._processes = ComputeProcesses()

    def open(self) -> str:
        try:
            self._nvml, version = open_nvml(self._library)
        except NvmlUnavailable as error:
            raise BackendUnavailable(str(error)) from None
        return f"NVML driver {version}"

    def close(self) -> None:
        if self._nvml is not None:
            nvml, self._nvml = self._nvml, None
            shutdown(nvml)

    def _process_list(self, handle: object) -> list[object]:
        return self._processes(self._module(), handle)

    def _module(self) -> ModuleType:
        if self._nvml is None:
            raise BackendUnavailable("NVML is not initialised")
        return self._nvml

    def _classify(self, error: Exception) -> type[Exception] | None:
        """Which of our outcomes a pynvml error means; None for "this measurement is absent"."""
        outcome = classify(error)
        if outcome == "absent":
            return None
        return BackendUnavailable if outcome == "fatal" else DeviceLost

    def _expand(self, handle: object) -> list[object]:
        """A GPU in MIG mode is measured through its MIG devices; otherwise the GPU itself."""
        nvml = self._module()
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError:
            return [handle]
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return [handle]
        children: list[object] = []
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                children.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
            except nvml.NVMLError_NotFound:
                continue
        return children

    def _lookup(self, call: object, *args: object, expand: bool = True) -> tuple[list[object], bool]:
        """One handle lookup, a GPU expanded to its MIG devices: (handles, lost). A lost GPU answers
        ([], True) so the other GPUs carry on; a selector that names nothing answers ([], False)."""
        nvml = self._module()
        try:
            handle = call(*args)  # type: ignore[operator]
            return (self._expand(handle) if expand else [handle]), False
        except nvml.NVMLError as error:
            outcome = self._classify(error)
            if outcome is BackendUnavailable:
                raise BackendUnavailable(str(error)) from None
            return [], error_name(error) in LOST

    def _handles(self, selector: Selector) -> tuple[list[object], bool]:
        nvml = self._module()
        if selector.kind == "uuid":
            return self._lookup(nvml.nvmlDeviceGetHandleByUUID, selector.value)
        if selector.kind == "all":
            handles: list[object] = []
            lost = False
            for index in range(nvml.nvmlDeviceGetCount()):
                found, gone = self._lookup(nvml.nvmlDeviceGetHandleByIndex, index)
                handles.extend(found)
                lost = lost or gone
            return handles, lost
        gpu_index, _, mig_index = selector.value.partition(":")
        parents, lost = self._lookup(nvml.nvmlDeviceGetHandleByIndex, int(gpu_index), expand=not mig_index)
        if not mig_index or not parents:
            return parents, lost
        return self._lookup(
            nvml.nvmlDeviceGetMigDeviceHandleByIndex, parents[0], int(mig_index), expand=False
        )

    def _identity(self, handle: object) -> tuple[str | None, str | None]:
        """(product or MIG profile name, parent GPU UUID for a MIG device); None where NVML cannot say."""
        nvml = self._module()
        name = parent = None
        with contextlib.suppress(nvml.NVMLError):
            name = str(nvml.nvmlDeviceGetName(handle))
        with contextlib.suppress(nvml.NVMLError):
            if nvml.nvmlDeviceIsMigDeviceHandle(handle):
                parent = str(
                    nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle))
                )
        return name, parent

    def resolve(self, selectors: Sequence[Selector]) -> Resolution:
        nvml = self._module()
        devices: dict[str, Device] = {}
        missing: list[str] = []
        incomplete = False
        for selector in selectors:
            handles, lost = self._handles(selector)
            if lost:
                incomplete = True
                if selector.kind == "uuid":
                    missing.append(selector.value)
            for handle in handles:
                try:
                    uuid = nvml.nvmlDeviceGetUUID(handle)
                except nvml.NVMLError as error:
                    if self._classify(error) is BackendUnavailable:
                        raise BackendUnavailable(str(error)) from None
                    incomplete = True
                    continue
                if uuid not in devices:
                    name, parent = self._identity(handle)
                    devices[uuid] = Device(uuid=uuid, handle=handle, name=name, parent_uuid=parent)
        return Resolution(list(devices.values()), tuple(missing), incomplete)

    def _read(self, device: Device, field: str, call: object, *args: object) -> object | None:
        """One NVML call for one measurement: None when absent (remembered, so it is not asked again)."""
        if field in device.unsupported:
            return None
        nvml = self._module()
        try:
            return call(device.handle, *args)  # type: ignore[operator]
        except (nvml.NVMLError, nvml.NVMLLibraryMismatchError) as error:
            outcome = self._classify(error)
            if outcome is None:
                device.unsupported.add(field)
                return None
            raise outcome(f"{device.uuid}: {error}") from None

    def sample(self, device: Device) -> GpuSample:
        nvml = self._module()
        utilization = self._read(device, "utilization", nvml.nvmlDeviceGetUtilizationRates)
        memory = self._read(device, "memory", nvml.nvmlDeviceGetMemoryInfo)
        energy = self._read(device, "energy", nvml.nvmlDeviceGetTotalEnergyConsumption)
        processes = self._read(device, "processes", self._process_list)
        process_list = list(processes) if isinstance(processes, list) else None
        return GpuSample(
            uuid=device.uuid,
            status=measurements_status(device.unsupported),
            name=device.name,
            parent_uuid=device.parent_uuid,
            sm_util_pct=float(utilization.gpu) if utilization is not None else None,  # type: ignore[attr-defined]
            mem_used_bytes=int(memory.used) if memory is not None else None,  # type: ignore[attr-defined]
            mem_total_bytes=int(memory.total) if memory is not None else None,  # type: ignore[attr-defined]
            energy_millijoules=int(energy) if isinstance(energy, int) else None,
            process_count=len(process_list) if process_list is not None else None,
            process_mem_bytes=(
                sum(p.usedGpuMemory or 0 for p in process_list) if process_list is not None else None
            ),
        )


def measurements_status(unsupported: set[str]) -> GpuStatus:
    """ok, partial (some measurements not supported here) or not_supported (none are)."""
    if not unsupported:
        return "ok"
    return "not_supported" if unsupported >= set(FIELDS) else "partial"
