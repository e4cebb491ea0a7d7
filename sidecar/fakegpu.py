"""A pure-Python stand-in for NVML behind the same `GpuBackend`, for the demo and machines without GPUs.
Deterministic: a pod's device k has a fixed UUID and a fixed saw-tooth utilisation."""

from __future__ import annotations

import random
from collections.abc import Sequence

from sidecar.gpus import Device, GpuSample, Resolution, Selector

_TOTAL_BYTES = 80 * 1024**3
_UTIL_PATTERN = (10.0, 35.0, 60.0, 85.0, 60.0, 35.0)


def fake_uuid(seed: str, index: int) -> str:
    """A stable, GPU-shaped UUID for fake device `index` of `seed` (the pod)."""
    # random.Random, not hashlib: hashlib would load OpenSSL's libcrypto into a process kept small.
    digits = f"{random.Random(f'{seed}/{index}').getrandbits(128):032x}"
    return f"GPU-{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


class FakeBackend:
    """`count` synthetic GPUs; selectors by index or `all` pick among them, UUID selectors name new ones."""

    def __init__(self, seed: str, count: int) -> None:
        self._uuids = [fake_uuid(seed, index) for index in range(count)]
        self._readings: dict[str, int] = {}
        self._energy: dict[str, int] = {}

    def open(self) -> str:
        return "fake NVML (synthetic figures)"

    def close(self) -> None:
        return None

    def resolve(self, selectors: Sequence[Selector]) -> Resolution:
        chosen: dict[str, Device] = {}
        for selector in selectors:
            if selector.kind == "all":
                names = self._uuids
            elif selector.kind == "uuid":
                names = [selector.value]
            else:
                index = int(selector.value.partition(":")[0])
                names = self._uuids[index : index + 1]
            for uuid in names:
                chosen.setdefault(uuid, Device(uuid=uuid))
        return Resolution(list(chosen.values()))

    def sample(self, device: Device) -> GpuSample:
        reading = self._readings.get(device.uuid, 0)
        self._readings[device.uuid] = reading + 1
        utilization = _UTIL_PATTERN[reading % len(_UTIL_PATTERN)]
        used = int(_TOTAL_BYTES * (0.25 + utilization / 400))
        # A millijoule counter that only grows, like NVML's: 300 W at full load, one reading a second.
        energy = self._energy.get(device.uuid, 0) + int(utilization * 3000)
        self._energy[device.uuid] = energy
        return GpuSample(
            uuid=device.uuid,
            name="Fake GPU 80GB",
            sm_util_pct=utilization,
            mem_used_bytes=used,
            mem_total_bytes=_TOTAL_BYTES,
            energy_millijoules=energy,
            process_count=1,
            process_mem_bytes=used,
        )
