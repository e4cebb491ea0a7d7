"""The NVML boundary the sidecar and the node agent share (neither imports the other; gpuaccounting may not
import pynvml): pynvml loaded and shut down, compute processes on any driver. A named library file is
loaded first; its soname `libnvidia-ml.so.1` makes pynvml's own load find it."""

from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path
from types import ModuleType
from typing import Any


class NvmlUnavailable(Exception):
    """The library cannot be loaded or initialised."""


def open_nvml(library: Path | None = None) -> tuple[ModuleType, str]:
    """pynvml, initialised, and the driver's version; NvmlUnavailable when it cannot be."""
    import pynvml

    if library is not None:
        try:
            ctypes.CDLL(str(library))
        except OSError as error:
            raise NvmlUnavailable(f"cannot load {library}: {error}") from None
    try:
        pynvml.nvmlInit()
        version = str(pynvml.nvmlSystemGetDriverVersion())
    except pynvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML initialisation failed: {error}") from None
    return pynvml, version


def shutdown(nvml: ModuleType) -> None:
    """Shut the library down. Shutting down a library whose GPU is lost may itself fail; there is
    nothing left to release then."""
    with contextlib.suppress(nvml.NVMLError):
        nvml.nvmlShutdown()


class ComputeProcesses:
    """The compute processes on a device: the `_v3` list, or `_v2` on drivers before 510 that lack `_v3`
    (pynvml raises FunctionNotFound for a symbol the library does not export; the switch is kept)."""

    def __init__(self) -> None:
        self._v2 = False

    def __call__(self, nvml: ModuleType, handle: Any) -> list[Any]:
        if not self._v2:
            try:
                return list(nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle))
            except nvml.NVMLError_FunctionNotFound:
                self._v2 = True
        return list(nvml.nvmlDeviceGetComputeRunningProcesses_v2(handle))
