"""The real backend: NVML through NVIDIA's pynvml, one device's errors kept to that device.

pynvml loads `libnvidia-ml.so.1` itself. When SIDECAR_NVML_LIBRARY names a file we load that file first:
it carries the soname `libnvidia-ml.so.1`, so pynvml's own `CDLL("libnvidia-ml.so.1")` then finds the
already-loaded library and everything else runs exactly as with the driver's copy.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from sidecar.gpus import BackendUnavailable, Device, DeviceLost, GpuSample, Selector

# Errors that mean "this library cannot work at all" rather than "this GPU has a problem".
_FATAL = ("LibraryNotFound", "DriverNotLoaded", "Uninitialized", "LibRmVersionMismatch")
# Errors that take one device out until the library is re-initialised.
_LOST = ("GpuIsLost", "ResetRequired", "GpuNotFound", "Unknown")
# Errors that mean "this figure is not available here"; the device carries on without it. pynvml turns a
# missing versioned symbol into NVMLLibraryMismatchError: an older driver, so the figure is absent too.
_ABSENT = (
    "NotSupported",
    "NoPermission",
    "NotFound",
    "FunctionNotFound",
    "NoData",
    "NVMLLibraryMismatchError",
)


class PynvmlBackend:
    """GPU figures from NVML; construct freely, nothing is loaded until `open`."""

    def __init__(self, library: Path | None = None) -> None:
        self._library = library
        self._nvml: ModuleType | None = None

    def open(self) -> str:
        import pynvml

        if self._library is not None:
            try:
                ctypes.CDLL(str(self._library))
            except OSError as error:
                raise BackendUnavailable(f"cannot load {self._library}: {error}") from None
        try:
            pynvml.nvmlInit()
            version = pynvml.nvmlSystemGetDriverVersion()
        except pynvml.NVMLError as error:
            raise BackendUnavailable(f"NVML initialisation failed: {error}") from None
        self._nvml = pynvml
        return f"NVML driver {version}"

    def close(self) -> None:
        if self._nvml is None:
            return
        nvml, self._nvml = self._nvml, None
        # Shutting down a library whose GPU is lost may itself fail; there is nothing left to release.
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()

    def _module(self) -> ModuleType:
        if self._nvml is None:
            raise BackendUnavailable("NVML is not initialised")
        return self._nvml

    def _classify(self, error: Exception) -> type[Exception] | None:
        """Which of our outcomes a pynvml error means; None for "this figure is absent"."""
        name = type(error).__name__.removeprefix("NVMLError_")
        if name in _ABSENT:
            return None
        if name in _LOST:
            return DeviceLost
        if name in _FATAL:
            return BackendUnavailable
        return DeviceLost

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

    def _handles(self, selector: Selector) -> list[object]:
        nvml = self._module()
        if selector.kind == "uuid":
            return self._expand(nvml.nvmlDeviceGetHandleByUUID(selector.value))
        if selector.kind == "all":
            handles: list[object] = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handles.extend(self._expand(nvml.nvmlDeviceGetHandleByIndex(index)))
            return handles
        gpu_index, _, mig_index = selector.value.partition(":")
        parent = nvml.nvmlDeviceGetHandleByIndex(int(gpu_index))
        if mig_index:
            return [nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, int(mig_index))]
        return self._expand(parent)

    def resolve(self, selectors: Sequence[Selector]) -> list[Device]:
        nvml = self._module()
        devices: dict[str, Device] = {}
        for selector in selectors:
            try:
                handles = self._handles(selector)
                for handle in handles:
                    uuid = nvml.nvmlDeviceGetUUID(handle)
                    devices.setdefault(uuid, Device(uuid=uuid, handle=handle))
            except nvml.NVMLError as error:
                if self._classify(error) is BackendUnavailable:
                    raise BackendUnavailable(str(error)) from None
                continue
        return list(devices.values())

    def _read(self, device: Device, field: str, call: object, *args: object) -> object | None:
        """One NVML call for one figure: None when absent (remembered, so it is not asked again)."""
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
        processes = self._read(device, "processes", nvml.nvmlDeviceGetComputeRunningProcesses)
        process_list = list(processes) if isinstance(processes, list) else None
        return GpuSample(
            uuid=device.uuid,
            sm_util_pct=float(utilization.gpu) if utilization is not None else None,  # type: ignore[attr-defined]
            mem_used_bytes=int(memory.used) if memory is not None else None,  # type: ignore[attr-defined]
            mem_total_bytes=int(memory.total) if memory is not None else None,  # type: ignore[attr-defined]
            energy_millijoules=int(energy) if isinstance(energy, int) else None,
            process_count=len(process_list) if process_list is not None else None,
            process_mem_bytes=(
                sum(p.usedGpuMemory or 0 for p in process_list) if process_list is not None else None
            ),
        )
