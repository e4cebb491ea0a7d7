"""Which GPUs belong to this pod: an ordered list of strategies, the first that knows wins. When none knows
the sidecar reports allocation only (`gpus: []`); the charge, share x time, does not depend on any of this."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sidecar.gpus import Selector

HAMI_ALLOCATED = ("hami.io/vgpu-devices-allocated", "4pd.io/vgpu-devices-allocated")
GPUSHARE_INDEX = "ALIYUN_COM_GPU_MEM_IDX"

_INDEX = re.compile(r"^\d+(:\d+)?$")
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z/-]+$")
# The device plugin's time-slicing replicas append `::<n>` to the device's UUID (GPU-... or MIG-...).
_REPLICA = re.compile(r"::\d+$")


def device_uuid(item: str) -> str | None:
    """A GPU or MIG UUID from a device ID, a time-slicing replica suffix (`::3`) stripped; None otherwise."""
    uuid = _REPLICA.sub("", item.strip())
    return uuid if _UUID.match(uuid) else None


@dataclass(frozen=True, slots=True)
class Discovery:
    """The outcome: which strategy answered and what it selected (empty: allocation only)."""

    strategy: str
    selectors: tuple[Selector, ...]


Strategy = Callable[[], tuple[Selector, ...] | None]


def parse_visible_devices(value: str | None) -> tuple[Selector, ...] | None:
    """NVIDIA_VISIBLE_DEVICES as the container toolkit reads it (`all`, UUIDs or indices); None when it says
    nothing about GPUs (`none`, `void`, empty, unset), leaving the question to the next strategy."""
    if value is None:
        return None
    text = value.strip()
    if text.lower() in ("", "none", "void"):
        return None
    if text.lower() == "all":
        return (Selector("all"),)
    selectors: list[Selector] = []
    for item in (part.strip() for part in text.split(",")):
        if _INDEX.match(item):
            selectors.append(Selector("index", item))
        elif uuid := device_uuid(item):
            selectors.append(Selector("uuid", uuid))
    return tuple(dict.fromkeys(selectors)) or None


def read_downward_file(path: Path) -> dict[str, str]:
    """A downward-API `annotations`/`labels` file: one `key="value"` a line, value Go-quoted."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return {}
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, quoted = line.partition("=")
        if not sep:
            continue
        try:
            value = json.loads(quoted)
        except ValueError:
            value = quoted.strip('"')
        values[key.strip()] = str(value)
    return values


def parse_hami_allocation(value: str) -> tuple[Selector, ...]:
    """HAMi's `vgpu-devices-allocated`: containers split by ';', devices by ':', fields by ','
    with the UUID first (`GPU-...,NVIDIA,3000,30:;`). Every container's devices: the pod's GPUs."""
    uuids: dict[str, None] = {}
    for container in value.split(";"):
        for device in container.split(":"):
            uuid = device_uuid(device.split(",", 1)[0])
            if uuid:
                uuids[uuid] = None
    return tuple(Selector("uuid", uuid) for uuid in uuids)


def parse_gpushare_index(value: str) -> tuple[Selector, ...]:
    """Aliyun gpushare's `ALIYUN_COM_GPU_MEM_IDX`: the node-level index (or indices) of the GPU."""
    return tuple(Selector("index", part.strip()) for part in value.split(",") if part.strip().isdigit())


def strategies(visible_devices_env: str | None, podinfo_dir: Path | None) -> list[tuple[str, Strategy]]:
    """The strategies in the order they are tried."""

    def visible_devices() -> tuple[Selector, ...] | None:
        return parse_visible_devices(visible_devices_env)

    def annotations() -> dict[str, str]:
        return read_downward_file(podinfo_dir / "annotations") if podinfo_dir else {}

    def hami() -> tuple[Selector, ...] | None:
        found = annotations()
        for key in HAMI_ALLOCATED:
            if found.get(key):
                return parse_hami_allocation(found[key]) or None
        return None

    def gpushare() -> tuple[Selector, ...] | None:
        value = annotations().get(GPUSHARE_INDEX)
        return (parse_gpushare_index(value) or None) if value else None

    return [
        ("nvidia_visible_devices", visible_devices),
        ("hami_annotation", hami),
        ("gpushare_annotation", gpushare),
    ]


def discover(visible_devices_env: str | None, podinfo_dir: Path | None) -> Discovery:
    """Run the strategies in order; allocation-only when none of them knows."""
    for name, strategy in strategies(visible_devices_env, podinfo_dir):
        selectors = strategy()
        if selectors:
            return Discovery(name, selectors)
    return Discovery("allocation_only", ())
