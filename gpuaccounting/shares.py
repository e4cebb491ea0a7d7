"""Which GPU-sharing system a pod uses and its share of a GPU, from the pod alone (pure; webhook and
timekeeper alike). Containers combine by Kubernetes' effective-request rule (docs/webhook.md); a problem
found is a `Violation` naming its rule, and enforcing it is the caller's decision."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from functools import lru_cache
from typing import Any, Final

from gpuaccounting.catalogue import (
    COUNTING_SYSTEMS,
    DEFAULT_CATALOGUE,
    GpuCatalogue,
    GpuEntry,
    SharingSystem,
)
from gpuaccounting.gpumodels import DEFAULT_GPU_MODELS, GpuModels
from gpuaccounting.quantity import QuantityError, parse_decimal, parse_quantity, shorten
from gpuaccounting.supply import DEFAULT_SUPPLY, GpuSupply

__all__ = ["SharingSystem"]  # re-exported: callers read the systems beside the shares


class Rule(StrEnum):
    """Governance rules a pod can break; the webhook enforces a configurable subset."""

    QUANTITY = "quantity"  # not a Kubernetes quantity at all
    POSITIVE_INTEGER = "positive-integer"
    VCUDA_CORE_RANGE = "vcuda-core-range"
    VCUDA_PAIRING = "vcuda-pairing"
    PERCENTAGE_RANGE = "percentage-range"
    DEVICE_COUNT_REQUIRED = "device-count-required"
    MEMORY_WITHIN_GPU = "memory-within-gpu"
    MIG_PROFILE = "mig-profile"
    VGPU_TYPE = "vgpu-type"
    CLEARML_FRACTION = "clearml-fraction"
    KAI_FRACTION = "kai-fraction"
    KAI_CONTAINER = "kai-container"
    SINGLE_SYSTEM = "single-system"
    UNKNOWN_ACCELERATOR = "unknown-accelerator"
    DRA_CLAIM = "dra-claim"  # a claim or template the pod names does not exist (yet)
    # Rules only the webhook can check: they need the namespace's state or the object's previous version.
    NAMESPACE_CAP = "namespace-cap"
    PROTECTED_ANNOTATIONS = "protected-annotations"
    PROTECTED_SIDECAR = "protected-sidecar"
    TOKEN_VOLUME_MOUNT = "token-volume-mount"
    SIDECAR_REQUIRED = "sidecar-required"
    PROTECTED_SHARE_INPUTS = "protected-share-inputs"
    REDUCED_GRACE = "reduced-grace"  # a reduced-class GPU pod's grace above the cap
    # Not a rule that may be disabled: the floor is lowered in the hardware file (`minimum_shares`).
    MINIMUM_SHARE = "minimum-share"
    # A GPU route beside the device plugin (gpuaccounting.supply): an env variable, a mount, a CDI
    # annotation, a runtime class, a hostPath or privilege that the hardware file's policy refuses.
    GPU_SUPPLY = "gpu-supply"


# Resource and metadata keys, by system.
NVIDIA_GPU: Final = "nvidia.com/gpu"
NVIDIA_GPU_SHARED: Final = "nvidia.com/gpu.shared"  # time-slicing with renameByDefault
HAMI_CORES: Final = "nvidia.com/gpucores"
HAMI_MEMORY: Final = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENTAGE: Final = "nvidia.com/gpumem-percentage"
VCUDA_CORE: Final = "tencent.com/vcuda-core"
VCUDA_MEMORY: Final = "tencent.com/vcuda-memory"
METAGPU: Final = "cnvrg.io/metagpu"
GPUSHARE_MEMORY: Final = "aliyun.com/gpu-mem"
GPUSHARE_COUNT: Final = "aliyun.com/gpu-count"
GPUSHARE_CORE_PERCENTAGE: Final = "aliyun.com/gpu-core.percentage"  # cGPU's compute share, in percent
VOLCANO_NUMBER: Final = "volcano.sh/vgpu-number"
VOLCANO_CORES: Final = "volcano.sh/vgpu-cores"
VOLCANO_MEMORY: Final = "volcano.sh/vgpu-memory"
VOLCANO_MEMORY_PERCENTAGE: Final = "volcano.sh/vgpu-memory-percentage"
CLEARML_FRACTION_LABEL: Final = "clearml-injector/fraction"
KAI_FRACTION_ANNOTATION: Final = "gpu-fraction"
KAI_CONTAINER_ANNOTATION: Final = "gpu-fraction-container-name"
KAI_MEMORY_ANNOTATION: Final = "gpu-memory"
KAI_DEVICES_ANNOTATION: Final = "gpu-fraction-num-devices"

# MIG profile names as NVIDIA's go-nvlib writes them (the DRA driver's `profile` attribute):
# [<c>c.]<g>g.<gb>gb, then +attributes (me, me.all, gfx) or -me; the device plugin's resource
# `nvidia.com/mig-<profile>` has each `+` as `.` (`mig-1g.10gb.me`, `mig-1g.10gb.me.all`, `mig-1g.10gb-me`).
_ATTRIBUTE: Final = r"[A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z0-9]+)*"
_MIG_PROFILE: Final = re.compile(
    rf"^(?:([0-9]{{1,2}})c\.)?([0-9]{{1,2}})g\.[0-9]{{1,4}}gb(?:[+.-]{_ATTRIBUTE}(?:,{_ATTRIBUTE})*)?$"
)
# An NVIDIA vGPU type as the sandbox device plugin names it (blanks as `_`): `NVIDIA_A10-12Q` (12 GB of an
# A10, Q-series), `GRID_T4-1B4`, a MIG-backed `NVIDIA_A100-2-10C` (2 slices, 10 GB) or `-1-5CME`.
_VGPU_TYPE: Final = re.compile(
    r"^(?:NVIDIA|GRID)_([A-Z0-9]{1,16})-(?:([0-9]{1,2})-)?([0-9]{1,3})[A-Z]{1,4}[0-9]?$"
)

# Plain `nvidia.com/gpu` is the device count that HAMi and MIG pods use too, so it joins either system.
JOINS_PLAIN_NVIDIA: Final = frozenset({SharingSystem.HAMI, SharingSystem.MIG})

DEFAULT_CLEARML_FRACTIONS: Final = frozenset(
    Fraction(n, d) for n, d in ((1, 16), (1, 8), (1, 4), (3, 8), (1, 2), (5, 8), (3, 4), (7, 8))
)


# The smallest share any floor may be: a millionth of a GPU still formats as "0.000001" (six places), and
# the timekeeper's report schema accepts it (timekeeper/usage/schemas.py, MIN_GPU_SHARE).
SMALLEST_MINIMUM_SHARE: Final = Fraction(1, 1_000_000)
# The smallest share admitted per system (`minimum_shares`): one step of the systems that count in
# percent or in units of 100 (HAMi, Volcano, gpu-manager, MetaGPU, KAI), and a thousandth where the
# system's own step is hardware's (time-slicing replicas, gpushare's GiB of a GPU up to 1 TiB).
DEFAULT_MINIMUM_SHARES: Final = frozenset(
    {
        **{system: Fraction(1, 100) for system in SharingSystem},
        SharingSystem.NVIDIA: Fraction(1, 1000),
        SharingSystem.GPUSHARE: Fraction(1, 1000),
    }.items()
)
# One (system, floor) pair per system; a frozenset keeps its hash, and reads are cached by hardware.
MinimumShares = frozenset[tuple[SharingSystem, Fraction]]


@dataclass(frozen=True, slots=True)
class GpuHardware:
    """Sizes that depend on the cluster's hardware and device-plugin configuration."""

    gpu_memory_mib: int = 81920  # an 80 GB A100/H100
    mig_slices_per_gpu: int = 7
    time_slicing_replicas: int = 1
    time_slicing_renamed: bool = False  # renameByDefault: only nvidia.com/gpu.shared is time-sliced
    metagpu_units_per_gpu: int = 100
    gpushare_memory_unit_mib: int = 1024  # gpushare counts GiB unless its plugin says MiB
    clearml_fractions: frozenset[Fraction] = DEFAULT_CLEARML_FRACTIONS
    catalogue: GpuCatalogue = DEFAULT_CATALOGUE  # which resources and DeviceClasses are GPUs
    minimum_shares: MinimumShares = DEFAULT_MINIMUM_SHARES
    supply: GpuSupply = DEFAULT_SUPPLY  # the routes to a GPU beside the device plugin, refused or allowed
    models: GpuModels = DEFAULT_GPU_MODELS  # which GPU models node pools and MIG profiles are (placement.py)

    def minimum_share(self, system: SharingSystem) -> Fraction:
        return next(
            (floor for named, floor in self.minimum_shares if named is system), SMALLEST_MINIMUM_SHARE
        )


@dataclass(frozen=True, slots=True)
class Violation:
    """One malformed or disallowed request, worded so a user knows what to change."""

    rule: Rule
    message: str
    container: str | None = None
    resource: str | None = None
    value: str | None = None

    def describe(self) -> str:
        where = f'container "{self.container}": ' if self.container else ""
        what = f"{self.resource}={self.value}: " if self.resource else ""
        return f"{where}{what}{self.message} (rule {self.rule})"


@dataclass(frozen=True, slots=True)
class ContainerShare:
    name: str
    role: str  # "container", "init" or "sidecar" (a restartable init container)
    system: SharingSystem | None
    share: Fraction


@dataclass(frozen=True, slots=True)
class PodShare:
    """What a pod asks for: its sharing system (None for a non-GPU pod), its GPU share, what is wrong."""

    system: SharingSystem | None
    share: Fraction
    systems: tuple[SharingSystem, ...] = ()
    containers: tuple[ContainerShare, ...] = ()
    violations: tuple[Violation, ...] = field(default=())
    claims: tuple[str, ...] = ()  # the pod's resourceClaims entries that ask for GPUs (gpuaccounting.dra)

    @property
    def uses_gpu(self) -> bool:
        return self.system is not None


NO_GPU: Final = PodShare(system=None, share=Fraction(0))


def format_share(share: Fraction) -> str:
    """The share as a short decimal string (at most six places), as annotations and env carry it."""
    text = f"{float(share):.6f}".rstrip("0").rstrip(".")
    return text or "0"


def below_minimum(system: SharingSystem, share: Fraction, hardware: GpuHardware) -> Violation | None:
    """The minimum-share violation of a pod whose whole share is `share` under `system`, if it is one."""
    floor = hardware.minimum_share(system)
    if share >= floor:
        return None
    return Violation(
        Rule.MINIMUM_SHARE,
        f"the pod's GPU share {float(share):.6g} is below the smallest share gpu-timekeeper admits"
        f" for {system}, {format_share(floor)} (hardware file: minimum_shares)",
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _gpu_requests(container: Mapping[str, Any], catalogue: GpuCatalogue) -> dict[str, object]:
    """The container's GPU requests; an extended resource given only as a limit is requested at the limit."""
    resources = _mapping(container.get("resources"))
    requests = _mapping(resources.get("requests"))
    limits = _mapping(resources.get("limits"))
    wanted: dict[str, object] = {}
    entry = catalogue.entry
    for source in (limits, requests):  # requests win where both are given
        for name, value in source.items():
            if entry(name) is not None:  # a GPU resource
                wanted[name] = value
    return wanted


class _Reader:
    """Collects violations while reading one container or one pod's metadata."""

    def __init__(self, hardware: GpuHardware, container: str | None) -> None:
        self.hardware = hardware
        self.container = container
        self.violations: list[Violation] = []

    def flag(self, rule: Rule, message: str, resource: str | None = None, value: object = None) -> None:
        shown = None if value is None else shorten(str(value))  # echo the value, not a megabyte of it
        self.violations.append(Violation(rule, message, self.container, resource, shown))

    def number(self, resource: str, raw: object) -> Fraction | None:
        try:
            return _exact(raw)
        except QuantityError:
            self.flag(Rule.QUANTITY, "is not a Kubernetes quantity", resource, raw)
            return None

    def count(self, resource: str, raw: object) -> Fraction | None:
        """A quantity the system wants as a positive whole number."""
        value = self.number(resource, raw)
        if value is not None and (value.denominator != 1 or value <= 0):
            self.flag(Rule.POSITIVE_INTEGER, "must be a positive whole number", resource, raw)
        return value

    def percentage(self, resource: str, raw: object) -> Fraction | None:
        value = self.count(resource, raw)
        if value is not None and value > 100:
            self.flag(Rule.PERCENTAGE_RANGE, "is a percentage and must be 1-100", resource, raw)
        return value

    def memory_fraction(self, resource: str, raw: object, unit_mib: int = 1) -> Fraction | None:
        """Memory asked of one GPU as a fraction of the configured GPU memory (at most one GPU)."""
        value = self.count(resource, raw)
        if value is None:
            return None
        fraction = value * unit_mib / self.hardware.gpu_memory_mib
        if fraction > 1:
            self.flag(
                Rule.MEMORY_WITHIN_GPU,
                f"is more memory than one GPU has (configured {self.hardware.gpu_memory_mib} MiB)",
                resource,
                raw,
            )
            return Fraction(1)
        return fraction


def _units_per_gpu(hardware: GpuHardware, name: str, entry: GpuEntry) -> int:
    """How many of a counted resource make one GPU: the entry's number, else the system's own rule."""
    if entry.units_per_gpu is not None:
        return entry.units_per_gpu
    if entry.system is SharingSystem.NVIDIA and (
        name == NVIDIA_GPU_SHARED or not hardware.time_slicing_renamed
    ):
        return hardware.time_slicing_replicas
    return 1


def _count_share(
    reader: _Reader, requests: Mapping[str, object], systems: frozenset[SharingSystem]
) -> Fraction:
    """The GPUs the requests of counted resources of `systems` come to (whole GPUs or replicas)."""
    catalogue = reader.hardware.catalogue
    share = Fraction(0)
    for name, raw in requests.items():
        entry = catalogue.entry(name)
        if entry is None or entry.system not in systems:
            continue
        if (count := reader.count(name, raw)) is not None:
            share += count / _units_per_gpu(reader.hardware, name, entry)
    return share


_PLAIN_NVIDIA: Final = frozenset({SharingSystem.NVIDIA})


def mig_gpu_slices(profile: str, slices_per_gpu: int) -> int | None:
    """The slices of the GPU instance a MIG profile holds; None for a name that is no profile of such a GPU. A
    compute-instance profile (`1c.2g.20gb`) holds its whole GPU instance: one compute instance per GPU
    instance."""
    found = _MIG_PROFILE.match(profile)
    if found is None:
        return None
    compute, gpu = found.group(1), int(found.group(2))
    if not 1 <= gpu <= slices_per_gpu or (compute is not None and not 1 <= int(compute) <= gpu):
        return None
    return gpu


def _mig_share(reader: _Reader, requests: Mapping[str, object]) -> Fraction:
    slices = reader.hardware.mig_slices_per_gpu
    catalogue = reader.hardware.catalogue
    share = Fraction(0)
    for name, raw in requests.items():
        entry = catalogue.entry(name)
        if entry is None or entry.system is not SharingSystem.MIG:
            continue
        held = mig_gpu_slices(name.rsplit("/", 1)[-1].removeprefix("mig-"), slices)
        if held is None:
            reader.flag(
                Rule.MIG_PROFILE,
                f"is not a MIG profile of a GPU with {slices} compute slices",
                name,
                raw,
            )
            continue
        if (count := reader.count(name, raw)) is not None:
            share += count * held / slices
    return share


def _vgpu_type_fraction(reader: _Reader, name: str, raw: object) -> Fraction:
    """One NVIDIA vGPU's share: its type's framebuffer over its board's (`vgpu_board_memory_gb`; a 0 GB
    type such as M10-0B has half a GB), a MIG-backed type its slices over `mig_slices_per_gpu`. A name
    that is no vGPU type, or a board the catalogue does not know, counts whole and is flagged."""
    hardware = reader.hardware
    found = _VGPU_TYPE.match(name.rsplit("/", 1)[-1])
    if found is None:
        reader.flag(Rule.VGPU_TYPE, "is not an NVIDIA vGPU type name (such as NVIDIA_A10-12Q)", name, raw)
        return Fraction(1)
    board, slices, framebuffer = found.group(1), found.group(2), int(found.group(3))
    if slices is not None:
        return min(Fraction(int(slices), hardware.mig_slices_per_gpu), Fraction(1))
    board_gb = hardware.catalogue.vgpu_boards.get(board)
    if board_gb is not None:
        return min((framebuffer or Fraction(1, 2)) / Fraction(board_gb), Fraction(1))
    if not hardware.catalogue.unknown_entry().known:
        reader.flag(
            Rule.UNKNOWN_ACCELERATOR,
            f'is a vGPU of board {board}, whose memory the GPU catalogue does not know: add "{board}" to'
            " vgpu_board_memory_gb in the hardware configuration (its framebuffer in GB, e.g. 24), or set"
            ' unknown_accelerators to "whole-gpus"',
            name,
            raw,
        )
    return Fraction(1)


def _vgpu_type_share(reader: _Reader, requests: Mapping[str, object]) -> Fraction:
    """NVIDIA vGPUs (the sandbox device plugin's types): each count at its type's share."""
    share = Fraction(0)
    for name, raw in requests.items():
        entry = reader.hardware.catalogue.entry(name)
        if entry is None or entry.system is not SharingSystem.VGPU:
            continue
        per_device = _vgpu_type_fraction(reader, name, raw)
        if (count := reader.count(name, raw)) is not None:
            share += count * per_device
    return share


def _vgpu_share(
    reader: _Reader,
    requests: Mapping[str, object],
    number: str,
    cores: str,
    memory: str,
    memory_percentage: str | None,
) -> Fraction:
    """HAMi and Volcano vGPU: N devices, each a core percentage, else a memory fraction, else whole."""
    if number in requests:
        devices = reader.count(number, requests[number]) or Fraction(0)
    else:
        devices = Fraction(1)
        given = next(name for name in (cores, memory, memory_percentage) if name and name in requests)
        reader.flag(
            Rule.DEVICE_COUNT_REQUIRED,
            f"needs {number} (the number of vGPUs) beside it",
            given,
            requests[given],
        )
    per_device: Fraction | None = None
    if cores in requests:
        per_device = reader.percentage(cores, requests[cores])
        per_device = None if per_device is None else per_device / 100
    elif memory in requests:
        per_device = reader.memory_fraction(memory, requests[memory])
    elif memory_percentage is not None and memory_percentage in requests:
        per_device = reader.percentage(memory_percentage, requests[memory_percentage])
        per_device = None if per_device is None else per_device / 100
    if per_device is None:
        per_device = Fraction(1)
    return devices * per_device


def _vcuda_share(reader: _Reader, requests: Mapping[str, object]) -> Fraction:
    core_raw = requests.get(VCUDA_CORE)
    memory_raw = requests.get(VCUDA_MEMORY)
    if core_raw is None or memory_raw is None:
        given, missing = (VCUDA_CORE, VCUDA_MEMORY) if memory_raw is None else (VCUDA_MEMORY, VCUDA_CORE)
        reader.flag(
            Rule.VCUDA_PAIRING,
            f"gpu-manager needs both {VCUDA_CORE} and {VCUDA_MEMORY}; {missing} is missing",
            given,
            requests[given],
        )
    if memory_raw is not None:
        reader.count(VCUDA_MEMORY, memory_raw)
    if core_raw is None:
        return Fraction(0)
    core = reader.count(VCUDA_CORE, core_raw)
    if core is None:
        return Fraction(0)
    if core.denominator == 1 and core > 0 and not (core < 100 or core % 100 == 0):
        reader.flag(
            Rule.VCUDA_CORE_RANGE,
            "must be 1-99 (a fraction of one GPU) or a multiple of 100 (whole GPUs)",
            VCUDA_CORE,
            core_raw,
        )
    return core / 100


def _gpushare_share(reader: _Reader, requests: Mapping[str, object]) -> Fraction:
    """gpushare's memory is the pod's total, spread over gpu-count GPUs (one unless given); cGPU's core
    percentage beside it makes the share at least that much of one GPU."""
    devices = Fraction(1)
    for companion in (GPUSHARE_COUNT, GPUSHARE_CORE_PERCENTAGE):
        if companion in requests and GPUSHARE_MEMORY not in requests:
            reader.flag(
                Rule.DEVICE_COUNT_REQUIRED,
                f"needs {GPUSHARE_MEMORY} beside it",
                companion,
                requests[companion],
            )
    if GPUSHARE_COUNT in requests:
        devices = reader.count(GPUSHARE_COUNT, requests[GPUSHARE_COUNT]) or Fraction(1)
    cores = Fraction(0)
    if GPUSHARE_CORE_PERCENTAGE in requests:
        percent = reader.percentage(GPUSHARE_CORE_PERCENTAGE, requests[GPUSHARE_CORE_PERCENTAGE])
        cores = Fraction(0) if percent is None else percent / 100
    if GPUSHARE_MEMORY not in requests:
        return cores
    raw = requests[GPUSHARE_MEMORY]
    memory = reader.count(GPUSHARE_MEMORY, raw)
    if memory is None:
        return cores
    share = max(memory * reader.hardware.gpushare_memory_unit_mib / reader.hardware.gpu_memory_mib, cores)
    if share > devices:
        reader.flag(
            Rule.MEMORY_WITHIN_GPU,
            f"is more memory than {devices} GPU(s) have"
            f" (configured {reader.hardware.gpu_memory_mib} MiB each)",
            GPUSHARE_MEMORY,
            raw,
        )
    return share


def _read_container(
    container: Mapping[str, Any], role: str, hardware: GpuHardware, violations: list[Violation]
) -> ContainerShare | None:
    requests = {
        name: raw for name, raw in _gpu_requests(container, hardware.catalogue).items() if not _is_zero(raw)
    }  # a zero request (common in templates) asks for nothing
    if not requests:
        return None
    name = str(container.get("name", "?"))
    # The key carries each value's type: 1, 1.0 and True are equal as keys but not as quantities.
    key = tuple((resource, raw.__class__, raw) for resource, raw in requests.items())
    try:
        read, found = _read_requests_cached(name, role, key, hardware)
    except TypeError:  # an unhashable value (not a quantity at all): read it once, uncached
        read, found = _read_requests(name, role, key, hardware)
    violations.extend(found)
    return read


def _read_requests(
    name: str, role: str, key: tuple[tuple[str, type, object], ...], hardware: GpuHardware
) -> tuple[ContainerShare, tuple[Violation, ...]]:
    """One container's share and violations from its non-zero GPU requests (`key`: name, type, value)."""
    requests = {resource: raw for resource, _, raw in key}
    reader = _Reader(hardware, name)
    systems = set()
    for resource, raw in requests.items():
        entry = _entry(hardware, resource)
        systems.add(entry.system)
        if not entry.known:
            reader.flag(
                Rule.UNKNOWN_ACCELERATOR,
                f'is an accelerator the GPU catalogue does not name: add "{resource}" to gpu_resources in'
                ' the hardware configuration (e.g. {"system": "devices", "units_per_gpu": 1}), or to'
                ' non_gpu_resources if it is no GPU, or set unknown_accelerators to "whole-gpus"',
                resource,
                raw,
            )
    if len(systems) > 1 and systems & JOINS_PLAIN_NVIDIA:
        systems.discard(SharingSystem.NVIDIA)
    share = Fraction(0)
    if len(systems) > 1:
        reader.flag(
            Rule.SINGLE_SYSTEM,
            "uses more than one GPU-sharing system: " + ", ".join(sorted(systems)),
            ", ".join(sorted(requests)),
            ", ".join(str(requests[resource]) for resource in sorted(requests)),
        )
    system = min(systems)
    if system in COUNTING_SYSTEMS:
        share = _count_share(reader, requests, frozenset({system}))
    elif system is SharingSystem.MIG:
        share = _mig_share(reader, requests) + _count_share(reader, requests, _PLAIN_NVIDIA)
    elif system is SharingSystem.HAMI:
        share = _vgpu_share(reader, requests, NVIDIA_GPU, HAMI_CORES, HAMI_MEMORY, HAMI_MEMORY_PERCENTAGE)
    elif system is SharingSystem.VOLCANO:
        share = _vgpu_share(
            reader, requests, VOLCANO_NUMBER, VOLCANO_CORES, VOLCANO_MEMORY, VOLCANO_MEMORY_PERCENTAGE
        )
    elif system is SharingSystem.VCUDA:
        share = _vcuda_share(reader, requests)
    elif system is SharingSystem.VGPU:
        share = _vgpu_type_share(reader, requests)
    elif system is SharingSystem.METAGPU:
        units = reader.count(METAGPU, requests[METAGPU])
        share = Fraction(0) if units is None else units / hardware.metagpu_units_per_gpu
    elif system is SharingSystem.GPUSHARE:
        share = _gpushare_share(reader, requests)
    read = ContainerShare(name=name, role=role, system=system, share=max(share, Fraction(0)))
    return read, tuple(reader.violations)


def _entry(hardware: GpuHardware, resource: str) -> GpuEntry:
    """The entry of a resource `_gpu_requests` kept: every one of them has an entry."""
    entry = hardware.catalogue.entry(resource)
    assert entry is not None
    return entry


# Pods repeat a few container shapes (a Job's pods are one template): the arithmetic is done once per
# shape. The result is immutable, so sharing it between pods is safe.
_read_requests_cached = lru_cache(maxsize=4096)(_read_requests)


@lru_cache(maxsize=4096)
def _exact_cached(raw: str | int | float) -> Fraction:
    return Fraction(parse_quantity(raw))


def _exact(raw: object) -> Fraction:
    """A quantity as an exact Fraction; pods repeat a few values, so the parse is cached."""
    if isinstance(raw, str | int | float) and not isinstance(raw, bool):
        return _exact_cached(raw)
    return Fraction(parse_quantity(raw))  # raises QuantityError with the reason


def _is_zero(raw: object) -> bool:
    if isinstance(raw, str | int | float) and not isinstance(raw, bool):
        return raw in _ZEROS or (raw.__class__ is str and _is_zero_text(raw))
    try:
        return _exact(raw) == 0
    except QuantityError:
        return False


_ZEROS: Final = frozenset({0, "0"})  # 0.0 == 0: the float is in the set too


@lru_cache(maxsize=4096)
def _is_zero_text(raw: str) -> bool:
    """Zero in the other spellings ("0m", "0Gi", "0.0", "+0"); the cache makes a repeat a lookup."""
    try:
        return _exact_cached(raw) == 0
    except QuantityError:
        return False


def effective_share(
    init_containers: Iterable[ContainerShare], containers: Iterable[ContainerShare]
) -> Fraction:
    """Kubernetes' effective request, applied to shares (init containers in their spec order)."""
    sidecars = Fraction(0)
    largest_init = Fraction(0)
    for init in init_containers:
        if init.role == "sidecar":
            sidecars += init.share
            largest_init = max(largest_init, sidecars)
        else:
            largest_init = max(largest_init, sidecars + init.share)
    return max(largest_init, sidecars + sum((c.share for c in containers), Fraction(0)))


def _clearml_share(labels: Mapping[str, Any], hardware: GpuHardware, reader: _Reader) -> Fraction:
    raw = labels[CLEARML_FRACTION_LABEL]
    try:
        fraction = Fraction(parse_decimal(raw))
    except (ArithmeticError, ValueError):
        fraction = None
    if (
        fraction is None
        or fraction <= 0
        or (fraction.denominator != 1 and fraction not in hardware.clearml_fractions)
    ):
        allowed = ", ".join(str(f) for f in sorted(hardware.clearml_fractions))
        reader.flag(
            Rule.CLEARML_FRACTION,
            f"must be one of {allowed} or a whole number of GPUs",
            f"label {CLEARML_FRACTION_LABEL}",
            raw,
        )
        return Fraction(0) if fraction is None or fraction < 0 else fraction
    return fraction


def _kai_share(
    annotations: Mapping[str, Any], container_names: set[str], hardware: GpuHardware, reader: _Reader
) -> Fraction:
    devices = Fraction(1)
    if KAI_DEVICES_ANNOTATION in annotations:
        raw_devices = annotations[KAI_DEVICES_ANNOTATION]
        devices = reader.count(f"annotation {KAI_DEVICES_ANNOTATION}", raw_devices) or Fraction(0)
    if (target := annotations.get(KAI_CONTAINER_ANNOTATION)) is not None and target not in container_names:
        reader.flag(
            Rule.KAI_CONTAINER,
            "names no container of this pod",
            f"annotation {KAI_CONTAINER_ANNOTATION}",
            target,
        )
    if KAI_FRACTION_ANNOTATION in annotations:
        raw = annotations[KAI_FRACTION_ANNOTATION]
        if KAI_MEMORY_ANNOTATION in annotations:
            reader.flag(
                Rule.KAI_FRACTION,
                f"cannot be given together with annotation {KAI_MEMORY_ANNOTATION}",
                f"annotation {KAI_FRACTION_ANNOTATION}",
                raw,
            )
        try:
            fraction = Fraction(parse_decimal(raw))
        except (ArithmeticError, ValueError):
            fraction = Fraction(-1)
        if not 0 < fraction <= 1:
            reader.flag(
                Rule.KAI_FRACTION,
                "must be a fraction of one GPU, above 0 and at most 1",
                f"annotation {KAI_FRACTION_ANNOTATION}",
                raw,
            )
            return Fraction(0)
        return devices * fraction
    per_device = reader.memory_fraction(
        f"annotation {KAI_MEMORY_ANNOTATION}", annotations[KAI_MEMORY_ANNOTATION]
    )
    return devices * (per_device or Fraction(0))


_POD_LEVEL_LABELS: Final = (CLEARML_FRACTION_LABEL,)
_POD_LEVEL_ANNOTATIONS: Final = (
    KAI_FRACTION_ANNOTATION,
    KAI_MEMORY_ANNOTATION,
    KAI_DEVICES_ANNOTATION,
    KAI_CONTAINER_ANNOTATION,
)


def share_inputs(pod: Mapping[str, Any], catalogue: GpuCatalogue = DEFAULT_CATALOGUE) -> dict[str, object]:
    """Everything a pod's share is read from, by where it is (a label, an annotation, a container's GPU
    requests, its DRA claims): a pod whose inputs did not change has the share it was admitted with."""
    metadata = _mapping(pod.get("metadata"))
    labels = _mapping(metadata.get("labels"))
    annotations = _mapping(metadata.get("annotations"))
    spec = _mapping(pod.get("spec"))
    found: dict[str, object] = {f"label {key}": labels[key] for key in _POD_LEVEL_LABELS if key in labels}
    found.update(
        {f"annotation {key}": annotations[key] for key in _POD_LEVEL_ANNOTATIONS if key in annotations}
    )
    for key in ("initContainers", "containers"):
        listed = spec.get(key)
        for container in listed if isinstance(listed, list) else ():
            if isinstance(container, dict) and (requests := _gpu_requests(container, catalogue)):
                role = container.get("restartPolicy") if key == "initContainers" else None
                found[f"{key} {container.get('name')} GPU requests"] = (requests, role)
    if "resourceClaims" in spec:
        found["spec.resourceClaims"] = spec["resourceClaims"]
    return found


def read_pod(
    pod: Mapping[str, Any], hardware: GpuHardware | None = None, *, skip_container: str = ""
) -> PodShare:
    """Read a pod's sharing system and GPU share; `skip_container` leaves out an injected sidecar."""
    hardware = hardware or GpuHardware()
    spec = _mapping(pod.get("spec"))
    metadata = _mapping(pod.get("metadata"))
    labels = _mapping(metadata.get("labels"))
    annotations = _mapping(metadata.get("annotations"))
    violations: list[Violation] = []
    init_shares: list[ContainerShare] = []
    app_shares: list[ContainerShare] = []
    names: set[str] = set()
    for key, target, default_role in (
        ("initContainers", init_shares, "init"),
        ("containers", app_shares, "container"),
    ):
        listed = spec.get(key)
        for container in listed if isinstance(listed, list) else ():
            if not isinstance(container, dict) or container.get("name") == skip_container:
                continue
            names.add(str(container.get("name")))
            role = (
                "sidecar"
                if default_role == "init" and container.get("restartPolicy") == "Always"
                else default_role
            )
            read = _read_container(container, role, hardware, violations)
            if read is not None:
                target.append(read)
    pod_level: list[tuple[SharingSystem, Fraction]] = []
    reader = _Reader(hardware, None)
    if CLEARML_FRACTION_LABEL in labels:
        pod_level.append((SharingSystem.CLEARML, _clearml_share(labels, hardware, reader)))
    if KAI_FRACTION_ANNOTATION in annotations or KAI_MEMORY_ANNOTATION in annotations:
        pod_level.append((SharingSystem.KAI, _kai_share(annotations, names, hardware, reader)))
    violations.extend(reader.violations)
    if not init_shares and not app_shares and not pod_level:
        return NO_GPU
    systems = sorted({c.system for c in (*init_shares, *app_shares) if c.system} | {s for s, _ in pod_level})
    if len(systems) > 1 and set(systems) & JOINS_PLAIN_NVIDIA:
        systems = [s for s in systems if s is not SharingSystem.NVIDIA]
    if len(systems) > 1:
        violations.append(
            Violation(
                Rule.SINGLE_SYSTEM,
                "a pod may use one GPU-sharing system, this one uses " + ", ".join(systems),
            )
        )
    share = effective_share(init_shares, app_shares) if init_shares or app_shares else Fraction(0)
    if pod_level:  # a label or annotation beside counted container resources is at least those
        share = max(share, pod_level[0][1]) if share else pod_level[0][1]
    system = pod_level[0][0] if pod_level else systems[0]
    if (below := below_minimum(system, share, hardware)) is not None:
        violations.append(below)
    return PodShare(
        system=system,
        share=share,
        systems=tuple(systems),
        containers=(*init_shares, *app_shares),
        violations=tuple(violations),
    )
