"""The cluster's hardware sizes, read from the one JSON file the webhook and the timekeeper both load.

Admission computes a pod's share with these sizes and the timekeeper recomputes shares and sizes
ResourceQuotas with them, so both must read the same file (deployment/ ships it as one ConfigMap mounted
into both Deployments). Every key is optional and defaults to `GpuHardware`'s value; an unknown key or a
value of the wrong type is refused at start, never read as a default:

    {"gpu_memory_mib": 40960, "mig_slices_per_gpu": 7, "time_slicing_replicas": 4,
     "time_slicing_renamed": false, "metagpu_units_per_gpu": 100, "gpushare_memory_unit_mib": 1024,
     "clearml_fractions": ["1/16", "1/8", "1/4", "3/8", "1/2", "5/8", "3/4", "7/8"],
     "minimum_shares": {"kai": "1/100", "nvidia": "1/1000"}}

`minimum_shares` names only the systems whose floor changes; the others keep theirs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

from gpuaccounting.shares import DEFAULT_MINIMUM_SHARES, SMALLEST_MINIMUM_SHARE, GpuHardware, SharingSystem

_FIELDS = {field.name: field.type for field in dataclasses.fields(GpuHardware)}


class HardwareConfigError(ValueError):
    """The hardware file cannot be used; the message names the file and the key."""


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{key} must be a positive integer, not {value!r}")
    return value


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


def _minimum_shares(key: str, value: Any) -> tuple[tuple[SharingSystem, Fraction], ...]:
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
    return tuple(sorted(floors.items()))


def _fractions(key: str, value: Any) -> frozenset[Fraction]:
    if not isinstance(value, list) or not value:
        raise ValueError(f'{key} must be a non-empty list of fractions such as "1/8" or 0.125')
    parsed = set()
    for item in value:
        fraction = _fraction(key, item)
        if fraction <= 0:
            raise ValueError(f"{key}: {item!r} is not above zero")
        parsed.add(fraction)
    return frozenset(parsed)


_READERS: dict[str, Callable[[str, Any], Any]] = {
    "int": _positive_int,
    "bool": _flag,
    "frozenset[Fraction]": _fractions,
    "MinimumShares": _minimum_shares,
}


def parse_hardware(document: Any) -> GpuHardware:
    """A `GpuHardware` from the file's parsed JSON (an object; missing keys take the defaults)."""
    if not isinstance(document, dict):
        raise ValueError("the hardware configuration must be a JSON object")
    unknown = sorted(set(document) - set(_FIELDS))
    if unknown:
        raise ValueError(f"unknown keys {unknown}; known: {sorted(_FIELDS)}")
    values = {key: _READERS[str(_FIELDS[key])](key, value) for key, value in document.items()}
    return GpuHardware(**values)


def load_hardware(path: Path | None) -> GpuHardware:
    """The sizes in `path`, or the defaults when no file is configured."""
    if path is None:
        return GpuHardware()
    try:
        return parse_hardware(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as error:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise HardwareConfigError(f"hardware file {path}: {error}") from error
