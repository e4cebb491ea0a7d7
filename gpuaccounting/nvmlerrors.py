"""What a pynvml error means, by its class name, for both NVML readers (the sidecar's and the node agent's).

Kept here, free of pynvml itself, so the two deployables classify errors by one rule.
"""

from __future__ import annotations

from typing import Literal

NvmlOutcome = Literal["fatal", "lost", "absent"]

# The library cannot work at all.
FATAL = frozenset({"LibraryNotFound", "DriverNotLoaded", "Uninitialized", "LibRmVersionMismatch"})
# One GPU stopped answering until the library is re-initialised.
LOST = frozenset({"GpuIsLost", "ResetRequired", "GpuNotFound", "Unknown"})
# This measurement is not available here; the device carries on without it. pynvml turns a missing versioned
# symbol into NVMLLibraryMismatchError: an older driver, so the measurement is absent too.
ABSENT = frozenset(
    {"NotSupported", "NoPermission", "NotFound", "FunctionNotFound", "NoData", "NVMLLibraryMismatchError"}
)


def error_name(error: BaseException) -> str:
    """`NVMLError_GpuIsLost` -> `GpuIsLost`."""
    return type(error).__name__.removeprefix("NVMLError_")


def classify(error: BaseException) -> NvmlOutcome:
    """fatal, lost or absent; an error NVML adds later counts as lost (retried), never as fatal."""
    name = error_name(error)
    if name in ABSENT:
        return "absent"
    if name in FATAL:
        return "fatal"
    return "lost"
