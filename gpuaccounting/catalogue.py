"""Which resources, name patterns and DeviceClasses are GPUs: an exact entry, else the longest matching
pattern; a name in neither that looks like an accelerator (`accelerator_patterns`) is an unknown GPU,
denied by default or counted as whole GPUs. Pure, standard library only."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from fnmatch import fnmatchcase
from fractions import Fraction
from typing import Final


class SharingSystem(StrEnum):
    NVIDIA = "nvidia"  # whole GPUs, or time-sliced replicas
    MIG = "nvidia-mig"
    VCUDA = "gpu-manager"
    METAGPU = "metagpu"
    GPUSHARE = "aliyun-gpushare"
    HAMI = "hami"
    CLEARML = "clearml"
    KAI = "kai"
    VOLCANO = "volcano-vgpu"
    DEVICES = "devices"  # another vendor's devices (or replicas of them), counted as GPUs
    VGPU = "nvidia-vgpu"  # NVIDIA vGPU types as the GPU Operator's sandbox device plugin names them


class UnknownAccelerators(StrEnum):
    """What an accelerator-like resource the catalogue does not name gets."""

    DENY = "deny"
    WHOLE_GPUS = "whole-gpus"


# Systems whose resources are plain counts: `units_per_gpu` of them make one GPU.
COUNTING_SYSTEMS: Final = frozenset({SharingSystem.NVIDIA, SharingSystem.CLEARML, SharingSystem.DEVICES})


@dataclass(frozen=True, slots=True)
class GpuEntry:
    """A GPU resource (or DeviceClass): its sharing system and, for a count, how many units make a GPU.

    `units_per_gpu` None: the system's own rule (NVIDIA: the time-slicing replicas; the others: 1).
    """

    system: SharingSystem
    units_per_gpu: int | None = None
    known: bool = True  # False: an accelerator the catalogue does not name, which its pod is denied for


@dataclass(frozen=True, slots=True)
class DeviceClassEntry:
    """A DeviceClass whose devices are GPUs: their system and the capacity one whole device has."""

    system: SharingSystem
    capacity: tuple[tuple[str, Fraction], ...] = ()  # consumable capacity of one device, e.g. cores: 100
    all_devices_cap: int = 8  # allocationMode All counts as at most this many devices

    def device_capacity(self, name: str) -> Fraction | None:
        return next((value for key, value in self.capacity if key == name), None)


DEFAULT_GPU_RESOURCES: Final[Mapping[str, GpuEntry]] = {
    name: GpuEntry(system)
    for name, system in (
        ("nvidia.com/gpu", SharingSystem.NVIDIA),
        ("nvidia.com/gpu.shared", SharingSystem.NVIDIA),  # time-slicing with renameByDefault
        ("nvidia.com/gpucores", SharingSystem.HAMI),
        ("nvidia.com/gpumem", SharingSystem.HAMI),
        ("nvidia.com/gpumem-percentage", SharingSystem.HAMI),
        ("tencent.com/vcuda-core", SharingSystem.VCUDA),
        ("tencent.com/vcuda-memory", SharingSystem.VCUDA),
        ("cnvrg.io/metagpu", SharingSystem.METAGPU),
        ("aliyun.com/gpu-mem", SharingSystem.GPUSHARE),
        ("aliyun.com/gpu-count", SharingSystem.GPUSHARE),
        ("aliyun.com/gpu-core.percentage", SharingSystem.GPUSHARE),
        ("volcano.sh/vgpu-number", SharingSystem.VOLCANO),
        ("volcano.sh/vgpu-cores", SharingSystem.VOLCANO),
        ("volcano.sh/vgpu-memory", SharingSystem.VOLCANO),
        ("volcano.sh/vgpu-memory-percentage", SharingSystem.VOLCANO),
    )
}
DEFAULT_GPU_RESOURCE_PATTERNS: Final[Mapping[str, GpuEntry]] = {
    "nvidia.com/mig-*": GpuEntry(SharingSystem.MIG),
    # ClearML's CFGI renames the device plugin's time-slicing replicas per GPU index, 8 to a GPU.
    "nvidia.com/gpu-*": GpuEntry(SharingSystem.CLEARML, 8),
    # The GPU Operator's sandbox device plugin (kubevirt-gpu-device-plugin): a GPU passed through whole is
    # named by its pci.ids entry, chip then board (`GA102GL [A10]` becomes `GA102GL_A10`)...
    "nvidia.com/G[A-Z][0-9][0-9][0-9]*": GpuEntry(SharingSystem.NVIDIA, 1),
    "nvidia.com/TU[0-9][0-9][0-9]*": GpuEntry(SharingSystem.NVIDIA, 1),
    "nvidia.com/AD[0-9][0-9][0-9]*": GpuEntry(SharingSystem.NVIDIA, 1),
    # ... and a vGPU by its type's name (`NVIDIA A10-12Q` becomes `NVIDIA_A10-12Q`; older drivers: `GRID`).
    "nvidia.com/NVIDIA_*": GpuEntry(SharingSystem.VGPU),
    "nvidia.com/GRID_*": GpuEntry(SharingSystem.VGPU),
}
# What a GPU vendor's domain holds that is no GPU: the sandbox device plugin's other PCI functions of a
# GPU board (`GA102_HIGH_DEFINITION_AUDIO_CONTROLLER`, USB and USB-C controllers), NVSwitches, the Network
# Operator's host-device NICs, and HAMi's task priority (asked beside a HAMi pod's GPU resources).
DEFAULT_NON_GPU_RESOURCES: Final = (
    "nvidia.com/*AUDIO_CONTROLLER",
    "nvidia.com/*_USB_*",
    "nvidia.com/*UCSI*",
    "nvidia.com/*NVSWITCH*",
    "nvidia.com/hostdev",
    "nvidia.com/priority",
)
# Each vGPU board's framebuffer in GB, as NVIDIA's vGPU types size theirs (`A10-12Q`: 12 of the A10's 24).
DEFAULT_VGPU_BOARD_MEMORY_GB: Final[Mapping[str, int]] = {
    "A2": 16,
    "A10": 24,
    "A16": 16,
    "A30": 24,
    "A40": 48,
    "A100": 40,
    "A100D": 80,
    "H100": 80,
    "H100XM": 80,
    "L4": 24,
    "L40": 48,
    "L40S": 48,
    "M10": 8,
    "M60": 8,
    "P40": 24,
    "T4": 16,
    "V100": 16,
    "V100D": 32,
    "V100DX": 32,
}
DEFAULT_GPU_DEVICE_CLASSES: Final[Mapping[str, DeviceClassEntry]] = {
    "gpu.nvidia.com": DeviceClassEntry(SharingSystem.NVIDIA),
    "mig.nvidia.com": DeviceClassEntry(SharingSystem.MIG),
    "hami-core-gpu.project-hami.io": DeviceClassEntry(SharingSystem.HAMI, (("cores", Fraction(100)),)),
}
DEFAULT_ACCELERATOR_PATTERNS: Final = (
    "*gpu*",  # amd.com/gpu, gpu.intel.com/i915 and gpu.intel.com/xe, renamed NVIDIA resources
    "nvidia.com/*",  # a GPU vendor's domain: what the catalogue does not name there is denied
    "amd.com/*",
    "habana.ai/*",
    "aws.amazon.com/neuron*",
    "*tpu*",
    "*npu*",
    "*/dcu*",
    "*/mlu*",
)


# The systems whose arithmetic reads resources by their own names: the catalogue may not give them others.
FIXED_NAMES: Final[Mapping[SharingSystem, frozenset[str]]] = {
    system: frozenset(name for name, entry in DEFAULT_GPU_RESOURCES.items() if entry.system is system)
    for system in SharingSystem
    if system not in COUNTING_SYSTEMS and system not in (SharingSystem.MIG, SharingSystem.VGPU)
}


def check_entry(name: str, entry: GpuEntry, *, pattern: bool) -> None:
    """Refuse an entry the share arithmetic could not read (ValueError naming the resource)."""
    if entry.units_per_gpu is not None and entry.system not in COUNTING_SYSTEMS:
        counting = ", ".join(sorted(COUNTING_SYSTEMS))
        raise ValueError(f"{name!r}: units_per_gpu is only for counted systems ({counting})")
    if entry.system in FIXED_NAMES and (pattern or name not in FIXED_NAMES[entry.system]):
        fixed = ", ".join(sorted(FIXED_NAMES[entry.system])) or "no resources (pod annotations only)"
        raise ValueError(f"{name!r}: {entry.system} reads only its own resources: {fixed}")


_NOT_SEEN: Final = object()
# The extended resource a pod may ask a DeviceClass's devices by (DRA's implicit extended resource).
DEVICE_CLASS_RESOURCE_PREFIX: Final = "deviceclass.resource.kubernetes.io/"


class GpuCatalogue:
    """The catalogue, immutable and hashable (the share arithmetic caches per hardware configuration)."""

    __slots__ = (
        "_hash",
        "_key",
        "_seen",
        "accelerator_patterns",
        "device_classes",
        "non_gpu",
        "patterns",
        "resources",
        "unknown",
        "vgpu_boards",
    )

    def __init__(
        self,
        resources: Mapping[str, GpuEntry] = DEFAULT_GPU_RESOURCES,
        patterns: Mapping[str, GpuEntry] = DEFAULT_GPU_RESOURCE_PATTERNS,
        device_classes: Mapping[str, DeviceClassEntry] = DEFAULT_GPU_DEVICE_CLASSES,
        accelerator_patterns: Iterable[str] = DEFAULT_ACCELERATOR_PATTERNS,
        unknown: UnknownAccelerators = UnknownAccelerators.DENY,
        non_gpu: Iterable[str] = DEFAULT_NON_GPU_RESOURCES,
        vgpu_boards: Mapping[str, int] = DEFAULT_VGPU_BOARD_MEMORY_GB,
    ) -> None:
        self.resources = dict(resources)
        # The most specific pattern first: JSON merged by Helm has no order to rely on.
        self.patterns = sorted(patterns.items(), key=lambda item: (-len(item[0]), item[0]))
        self.device_classes = dict(device_classes)
        self.accelerator_patterns = tuple(sorted(set(accelerator_patterns)))
        self.unknown = unknown
        self.non_gpu = tuple(sorted(set(non_gpu)))
        self.vgpu_boards = dict(vgpu_boards)
        self._key = (
            tuple(sorted(self.resources.items())),
            tuple(self.patterns),
            tuple(sorted(self.device_classes.items())),
            self.accelerator_patterns,
            unknown,
            self.non_gpu,
            tuple(sorted(self.vgpu_boards.items())),
        )
        self._hash = hash(self._key)  # the share arithmetic's caches hash the hardware on every read
        self._seen: dict[str, GpuEntry | None] = {}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GpuCatalogue) and self._key == other._key

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"GpuCatalogue{self._key!r}"

    def entry(self, resource: str) -> GpuEntry | None:
        """The resource's entry; None for a resource that is no GPU (`non_gpu` says so before any pattern).
        An accelerator the catalogue does not name counts as whole devices, marked unknown under `deny`
        (its pod is then denied)."""
        seen = self._seen.get(resource, _NOT_SEEN)
        if seen is not _NOT_SEEN:
            return seen  # type: ignore[return-value]
        found = self.resources.get(resource)
        not_gpu = found is None and any(fnmatchcase(resource, pattern) for pattern in self.non_gpu)
        if found is None and resource.startswith(DEVICE_CLASS_RESOURCE_PREFIX):
            found = self._implicit(resource.removeprefix(DEVICE_CLASS_RESOURCE_PREFIX))
        elif found is None and not not_gpu:
            found = next((e for pattern, e in self.patterns if fnmatchcase(resource, pattern)), None)
        if found is None and not not_gpu and self.looks_like_accelerator(resource):
            found = self.unknown_entry()
        if len(self._seen) >= 4096:  # pods name few resources; a flood of invented names must not grow this
            self._seen.clear()
        self._seen[resource] = found
        return found

    def _implicit(self, device_class: str) -> GpuEntry | None:
        """`deviceclass.resource.kubernetes.io/<class>: N` asks N of the class's devices: N GPUs at most."""
        known = self.device_classes.get(device_class)
        if known is not None:
            return GpuEntry(
                SharingSystem.NVIDIA if known.system is SharingSystem.NVIDIA else SharingSystem.DEVICES, 1
            )
        return self.unknown_entry() if self.looks_like_accelerator_class(device_class) else None

    def unknown_entry(self) -> GpuEntry:
        """What an accelerator the catalogue does not name counts as: whole devices, to deny or to charge."""
        return UNKNOWN if self.unknown is UnknownAccelerators.DENY else WHOLE_DEVICES

    def looks_like_accelerator_class(self, device_class: str) -> bool:
        """A DeviceClass name (a DNS name such as gpu.amd.com) matching an accelerator pattern's name part
        (a pattern for a whole domain, `amd.com/*`, says nothing about class names)."""
        lowered = device_class.lower()
        parts = (pattern.rsplit("/", 1)[-1] for pattern in self.accelerator_patterns)
        return any(part != "*" and fnmatchcase(lowered, part) for part in parts)

    def looks_like_accelerator(self, resource: str) -> bool:
        """An extended resource (a domain-prefixed name) whose name matches an accelerator pattern."""
        if "/" not in resource or resource.startswith("kubernetes.io/"):
            return False
        lowered = resource.lower()
        return any(fnmatchcase(lowered, pattern) for pattern in self.accelerator_patterns)


WHOLE_DEVICES: Final = GpuEntry(SharingSystem.DEVICES, 1)
UNKNOWN: Final = GpuEntry(SharingSystem.DEVICES, 1, known=False)
DEFAULT_CATALOGUE: Final = GpuCatalogue()
