"""The typed boundary between the sidecar and what tells it about GPUs: `PynvmlBackend` (NVML), the node
agent's and `FakeBackend`; everything above it is backend-agnostic."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from gpuaccounting.wire import GpuStatus

SelectorKind = Literal["uuid", "index", "all"]

# What a backend may be unable to measure on a device; named so "not supported" is logged once per field.
FIELDS = ("utilization", "memory", "energy", "processes")


@dataclass(frozen=True, slots=True)
class Selector:
    """One entry of a device list: a GPU or MIG UUID, an index ("0", or "0:1" for MIG device 1 of GPU 0),
    or every device the backend sees."""

    kind: SelectorKind
    value: str = ""


@dataclass(slots=True)
class Device:
    """A resolved device: its UUID, the backend's handle, and what it turned out unable to measure."""

    uuid: str
    handle: object = None
    unsupported: set[str] = field(default_factory=set)
    name: str | None = None
    parent_uuid: str | None = None


@dataclass(frozen=True, slots=True)
class Resolution:
    """What the selectors resolved to, and what could not be looked up because a GPU is lost (by UUID where
    the selector named one): the monitor keeps retrying those instead of forgetting them."""

    devices: list[Device]
    missing_uuids: tuple[str, ...] = ()
    incomplete: bool = False


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one device; None where the device could not say. The `pod_*` measurements are this pod's
    own processes on the device, where a node agent could attribute them (None: unknown)."""

    uuid: str
    status: GpuStatus = "ok"
    name: str | None = None
    parent_uuid: str | None = None
    sm_util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    energy_millijoules: int | None = None
    process_count: int | None = None
    process_mem_bytes: int | None = None
    pod_sm_util_pct: float | None = None
    pod_mem_used_bytes: int | None = None
    pod_process_count: int | None = None


class BackendUnavailable(Exception):
    """The backend cannot run at all (library missing, driver not loaded, init failed)."""


class DeviceLost(Exception):
    """One device stopped answering (NVML_ERROR_GPU_IS_LOST and friends); the others carry on."""


class GpuBackend(Protocol):
    """What the monitor needs from a GPU source."""

    def open(self) -> str:
        """Initialise; answer a short description (driver version). Raises BackendUnavailable."""
        ...

    def close(self) -> None:
        """Release the library; safe to call when open failed."""
        ...

    def resolve(self, selectors: Sequence[Selector]) -> Resolution:
        """Turn selectors into devices; selectors that match nothing are skipped, lost ones are named."""
        ...

    def sample(self, device: Device) -> GpuSample:
        """Read one device; fields it does not support come back None and land in device.unsupported.
        Raises DeviceLost or BackendUnavailable."""
        ...
