"""Keeps the GPU backend usable: opens it lazily, re-initialises with backoff, keeps errors per GPU. A lost
GPU or a missing library nulls the measurements; the report is never held back: the charge needs none."""

from __future__ import annotations

import time
from collections.abc import Callable

from sidecar.discovery import Discovery
from sidecar.gpus import BackendUnavailable, Device, DeviceLost, GpuBackend, GpuSample
from sidecar.logs import EventLog

FIRST_RETRY_SECONDS = 1.0


class GpuMonitor:
    """Samples the pod's devices through a backend; `poll()` once per sample tick."""

    def __init__(
        self,
        backend: GpuBackend,
        discover: Callable[[], Discovery],
        log: EventLog,
        retry_max_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._discover = discover
        self._log = log
        self._retry_max = retry_max_seconds
        self._clock = clock
        self._open = False
        self._devices: list[Device] = []
        self._known_uuids: tuple[str, ...] = ()
        # GPUs that stopped answering: kept, reported as lost and looked up again until they answer.
        self._lost: set[str] = set()
        # A selector could not be resolved because some GPU was lost (an index or `all`): retry too.
        self._incomplete = False
        # What has been logged, kept across re-initialisations so each change is said once.
        self._announced_lost: set[str] = set()
        self._announced_unsupported: dict[str, set[str]] = {}
        self._retry_at = 0.0
        self._delay = FIRST_RETRY_SECONDS
        self._problem: str | None = None

    @property
    def uuids(self) -> tuple[str, ...]:
        """The devices currently attributed to the pod (empty: allocation only)."""
        return self._known_uuids

    def _schedule_retry(self, now: float) -> None:
        self._retry_at = now + self._delay
        self._delay = min(self._delay * 2, self._retry_max)

    def _reopen(self, now: float) -> None:
        if self._open:
            self._backend.close()
            self._open = False
        discovery = self._discover()
        try:
            description = self._backend.open()
            self._open = True
            resolution = self._backend.resolve(discovery.selectors)
        except BackendUnavailable as error:
            self._devices = []
            # Known UUIDs stay listed (measurements None) so reports still say which GPUs the pod holds.
            self._known_uuids = tuple(s.value for s in discovery.selectors if s.kind == "uuid")
            if self._problem != str(error):
                self._log.warning(
                    "nvml_unavailable", reason=str(error), retry_in_seconds=round(self._delay, 1)
                )
                self._problem = str(error)
            self._schedule_retry(now)
            return
        resolved = {device.uuid for device in resolution.devices}
        self._devices = resolution.devices
        self._lost = (self._lost | set(resolution.missing_uuids)) - resolved
        self._incomplete = resolution.incomplete
        uuids = tuple(device.uuid for device in resolution.devices) + tuple(sorted(self._lost))
        if uuids != self._known_uuids or self._problem is not None:
            self._log.info(
                "gpus_discovered",
                backend=description,
                strategy=discovery.strategy,
                gpus=list(uuids),
                recovered=self._problem is not None,
            )
        self._known_uuids = uuids
        self._problem = None
        if self._lost or self._incomplete:
            self._schedule_retry(now)

    def _sample_one(self, device: Device, now: float) -> GpuSample:
        if device.uuid in self._lost:
            return GpuSample(
                uuid=device.uuid, status="lost", name=device.name, parent_uuid=device.parent_uuid
            )
        try:
            sample = self._backend.sample(device)
        except DeviceLost as error:
            self._lost.add(device.uuid)
            if device.uuid not in self._announced_lost:
                self._announced_lost.add(device.uuid)
                self._log.warning("gpu_lost", gpu=device.uuid, reason=str(error))
            self._schedule_retry(now)
            return GpuSample(
                uuid=device.uuid, status="lost", name=device.name, parent_uuid=device.parent_uuid
            )
        if device.uuid in self._announced_lost:
            self._announced_lost.discard(device.uuid)
            self._log.info("gpu_recovered", gpu=device.uuid)
        if device.unsupported and device.unsupported != self._announced_unsupported.get(device.uuid):
            self._announced_unsupported[device.uuid] = set(device.unsupported)
            self._log.info("gpu_figures_not_supported", gpu=device.uuid, figures=sorted(device.unsupported))
        return sample

    def poll(self) -> list[GpuSample]:
        """One reading of every attributed device; None measurements where a device or the library failed."""
        now = self._clock()
        if (not self._open or self._lost or self._incomplete) and now >= self._retry_at:
            self._reopen(now)
        if not self._open:
            return [GpuSample(uuid=uuid, status="unavailable") for uuid in self._known_uuids]
        try:
            samples = [self._sample_one(device, now) for device in self._devices]
            resolved = {device.uuid for device in self._devices}
            samples += [GpuSample(uuid=uuid, status="lost") for uuid in sorted(self._lost - resolved)]
        except BackendUnavailable as error:
            self._backend.close()
            self._open = False
            self._log.warning("nvml_unavailable", reason=str(error), retry_in_seconds=round(self._delay, 1))
            self._problem = str(error)
            self._schedule_retry(now)
            return [GpuSample(uuid=uuid, status="unavailable") for uuid in self._known_uuids]
        if not self._lost and not self._incomplete:
            self._delay = FIRST_RETRY_SECONDS
        return samples

    def close(self) -> None:
        if self._open:
            self._backend.close()
            self._open = False
