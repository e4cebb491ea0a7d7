"""Ground truth for exactness checks: the time a set of reports covers, from the sidecar's own state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuaccounting.clock import from_datetime
from gpuaccounting.wire import parse_timestamp


def bounds(report: dict[str, Any]) -> tuple[int, int]:
    return (
        from_datetime(parse_timestamp(report["interval_start"])),
        from_datetime(parse_timestamp(report["interval_end"])),
    )


def union(reports: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The covered time as disjoint [start, end) ranges in microseconds."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(bounds(r) for r in reports):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def persisted_state(buffer_dir: Path) -> dict[str, Any]:
    """The sidecar's state file: `anchor_us` (first start) and `covered_until_us` (last end)."""
    return json.loads((buffer_dir / "state.json").read_text())
