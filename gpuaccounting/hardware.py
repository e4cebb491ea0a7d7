"""The cluster's hardware sizes and GPU catalogue, from the one JSON file (one ConfigMap) the webhook and the
timekeeper both load, so both compute shares alike. Every key is optional (`GpuHardware`'s defaults); an
unknown key or a wrong type is refused at start, never read as a default."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

from gpuaccounting.catalogue import (
    DeviceClassEntry,
    GpuCatalogue,
    GpuEntry,
    SharingSystem,
    UnknownAccelerators,
    check_entry,
)
from gpuaccounting.gpumodels import GpuModels, gpu_models
from gpuaccounting.shares import (
    DEFAULT_MINIMUM_SHARES,
    SMALLEST_MINIMUM_SHARE,
    GpuHardware,
    MinimumShares,
)
from gpuaccounting.supply import GpuSupply, RouteMode, SupplyRoute

_FIELDS = {
    field.name: field.type
    for field in dataclasses.fields(GpuHardware)
    if field.name not in ("catalogue", "supply", "models")
}


class HardwareConfigError(ValueError):
    """The hardware file cannot be used; the message names the file and the key."""


def _positive_int(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{key} must be a positive integer, not {value!r}")
    return int(value)


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, not {value!r}")
    return value


def _fraction(key: str, item: Any) -> Fraction:
    try:
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise TypeError
        return Fraction(str(item))
    except (TypeError, ValueError, ZeroDivisionError):
        raise ValueError(f"{key}: {item!r} is not a fraction") from None


def _positive_fraction(key: str, item: Any) -> Fraction:
    fraction = _fraction(key, item)
    if fraction <= 0:
        raise ValueError(f"{key}: {item!r} is not above zero")
    return fraction


def _minimum_shares(key: str, value: Any) -> MinimumShares:
    if not isinstance(value, dict):
        raise ValueError(f'{key} must be an object such as {{"kai": "1/100"}}')
    known = {system.value for system in SharingSystem}
    floors = dict(DEFAULT_MINIMUM_SHARES)
    for name, item in value.items():
        if name not in known:
            raise ValueError(f"{key}: {name!r} is no sharing system; known: {sorted(known)}")
        floor = _fraction(f"{key}.{name}", item)
        if not SMALLEST_MINIMUM_SHARE <= floor <= 1:
            raise ValueError(f"{key}.{name}: {item!r} is not between 1/1000000 and 1")
        floors[SharingSystem(name)] = floor
    return frozenset(floors.items())


def _fractions(key: str, value: Any) -> frozenset[Fraction]:
    if not isinstance(value, list) or not value:
        raise ValueError(f'{key} must be a non-empty list of fractions such as "1/8" or 0.125')
    return frozenset(_positive_fraction(key, item) for item in value)


_READERS: dict[str, Callable[[str, Any], Any]] = {
    "int": _positive_int,
    "bool": _flag,
    "frozenset[Fraction]": _fractions,
    "MinimumShares": _minimum_shares,
}


def _object(key: str, value: Any, allowed: set[str] | None = None) -> dict[str, Any]:
    """A JSON object; with `allowed`, one whose keys are among those."""
    if not isinstance(value, dict):
        raise ValueError(f"{key} must be an object")
    if allowed is not None and (unknown := sorted(set(value) - allowed)):
        raise ValueError(f"{key}: unknown keys {unknown}; known: {sorted(allowed)}")
    return value


def _system(key: str, value: Any) -> SharingSystem:
    try:
        return SharingSystem(value)
    except ValueError:
        systems = [system.value for system in SharingSystem]
        raise ValueError(f"{key}.system must be one of {systems}, not {value!r}") from None


def _gpu_entries(key: str, value: Any, *, patterns: bool) -> dict[str, GpuEntry]:
    entries = {}
    for name, raw in _object(key, value).items():
        where = f"{key}[{name!r}]"
        spec = _object(where, raw, {"system", "units_per_gpu"})
        units = spec.get("units_per_gpu")
        entry = GpuEntry(
            _system(where, spec.get("system")),
            None if units is None else _positive_int(f"{where}.units_per_gpu", units),
        )
        check_entry(name, entry, pattern=patterns)
        entries[name] = entry
    return entries


def _device_classes(key: str, value: Any) -> dict[str, DeviceClassEntry]:
    classes = {}
    for name, raw in _object(key, value).items():
        where = f"{key}[{name!r}]"
        spec = _object(where, raw, {"system", "capacity", "all_devices_cap"})
        capacity = _object(f"{where}.capacity", spec.get("capacity", {}))
        classes[name] = DeviceClassEntry(
            _system(where, spec.get("system")),
            tuple(sorted((k, _positive_fraction(f"{where}.capacity.{k}", v)) for k, v in capacity.items())),
            _positive_int(f"{where}.all_devices_cap", spec.get("all_devices_cap", 8)),
        )
    return classes


def _patterns(key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise ValueError(f'{key} must be a list of name patterns such as "*gpu*"')
    return value


def _unknown(key: str, value: Any) -> UnknownAccelerators:
    try:
        return UnknownAccelerators(value)
    except ValueError:
        choices = [choice.value for choice in UnknownAccelerators]
        raise ValueError(f"{key} must be one of {choices}, not {value!r}") from None


def _board_memory(key: str, value: Any) -> dict[str, int]:
    return {str(board): _positive_int(f"{key}.{board}", gb) for board, gb in _object(key, value).items()}


# The catalogue's keys in the file: `GpuCatalogue`'s parameter each gives, and its reader.
CATALOGUE_KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "gpu_resources": ("resources", lambda key, value: _gpu_entries(key, value, patterns=False)),
    "gpu_resource_patterns": ("patterns", lambda key, value: _gpu_entries(key, value, patterns=True)),
    "gpu_device_classes": ("device_classes", _device_classes),
    "accelerator_patterns": ("accelerator_patterns", _patterns),
    "unknown_accelerators": ("unknown", _unknown),
    "non_gpu_resources": ("non_gpu", _patterns),
    "vgpu_board_memory_gb": ("vgpu_boards", _board_memory),
}


def _catalogue(document: dict[str, Any]) -> GpuCatalogue:
    """The catalogue from its keys in the file; a key not given keeps the shipped default."""
    return GpuCatalogue(
        **{
            parameter: read(key, document[key])
            for key, (parameter, read) in CATALOGUE_KEYS.items()
            if key in document
        }
    )


def _routes(key: str, value: Any) -> frozenset[SupplyRoute]:
    """The routes allowed everywhere: those whose mode is `allow`."""
    allowed = set()
    routes = [route.value for route in SupplyRoute]
    for name, mode in _object(key, value, set(routes)).items():
        if mode not in (RouteMode.REFUSE, RouteMode.ALLOW):
            raise ValueError(f"{key}[{name!r}] must be one of {[m.value for m in RouteMode]}, not {mode!r}")
        if mode == RouteMode.ALLOW:
            allowed.add(SupplyRoute(name))
    return frozenset(allowed)


def _exempt(key: str, value: Any) -> tuple[tuple[str, frozenset[str]], ...]:
    """Namespace to the ServiceAccounts there ("*": any) that may use every route."""
    exempt = []
    for namespace, accounts in _object(key, value).items():
        if not isinstance(accounts, list) or not all(isinstance(a, str) and a for a in accounts):
            raise ValueError(f'{key}[{namespace!r}] must be a list of ServiceAccount names, or ["*"]')
        exempt.append((namespace, frozenset(accounts)))
    return tuple(sorted(exempt))


def _runtime_classes(key: str, value: Any) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise ValueError(f'{key} must be a list of RuntimeClass names such as "nvidia"')
    return frozenset(value)


# The GPU supply's keys in the file: `GpuSupply`'s field each gives, and its reader.
SUPPLY_KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "gpu_supply_routes": ("allowed", _routes),
    "gpu_supply_exempt": ("exempt", _exempt),
    "gpu_runtime_classes": ("runtime_classes", _runtime_classes),
}


def _supply(document: dict[str, Any]) -> GpuSupply:
    """The policy from its keys in the file; a key not given keeps the shipped default (all refused)."""
    return GpuSupply(
        **{field: read(key, document[key]) for key, (field, read) in SUPPLY_KEYS.items() if key in document}
    )


def _model_names(key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(item, str) and item for item in value):
        raise ValueError(f'{key} must be a non-empty list of GPU models such as "NVIDIA-H100-80GB-HBM3"')
    return value


def _node_pools(key: str, value: Any) -> dict[str, dict[str, list[str]]]:
    """Node label key -> label value -> the GPU models of the nodes so labelled."""
    return {
        label: {
            str(pool): _model_names(f"{key}[{label!r}][{pool!r}]", models)
            for pool, models in _object(f"{key}[{label!r}]", values).items()
        }
        for label, values in _object(key, value).items()
    }


def _mig_profile_models(key: str, value: Any) -> dict[str, list[str]]:
    """MIG profile -> the GPU models it exists on."""
    return {
        str(profile): _model_names(f"{key}[{profile!r}]", models)
        for profile, models in _object(key, value).items()
    }


# The GPU models' keys in the file: `gpu_models`'s parameter each gives, and its reader.
MODEL_KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "gpu_node_pools": ("node_pools", _node_pools),
    "mig_profile_models": ("mig_profile_models", _mig_profile_models),
}


def _models(document: dict[str, Any]) -> GpuModels:
    """Where node pools and MIG profiles place a pod; a key not given keeps the shipped default."""
    return gpu_models(
        **{
            parameter: read(key, document[key])
            for key, (parameter, read) in MODEL_KEYS.items()
            if key in document
        }
    )


# Every key the file may have.
KEYS = frozenset({*_FIELDS, *CATALOGUE_KEYS, *SUPPLY_KEYS, *MODEL_KEYS})


def parse_hardware(document: Any) -> GpuHardware:
    """A `GpuHardware` from the file's parsed JSON (an object; missing keys take the defaults)."""
    if not isinstance(document, dict):
        raise ValueError("the hardware configuration must be a JSON object")
    unknown = sorted(set(document) - KEYS)
    if unknown:
        raise ValueError(f"unknown keys {unknown}; known: {sorted(KEYS)}")
    values = {
        key: _READERS[str(_FIELDS[key])](key, value) for key, value in document.items() if key in _FIELDS
    }
    return GpuHardware(
        **values, catalogue=_catalogue(document), supply=_supply(document), models=_models(document)
    )


def load_hardware(path: Path | None) -> GpuHardware:
    """The sizes in `path`, or the defaults when no file is configured."""
    if path is None:
        return GpuHardware()
    try:
        return parse_hardware(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as error:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise HardwareConfigError(f"hardware file {path}: {error}") from error
