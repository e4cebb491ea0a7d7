"""How deep a parsed JSON body nests, measured without recursion. orjson reads 1,024 levels; what both
servers do next recurses once per level and fails far sooner (Python's stack near 1,000 frames, orjson's
writer at 255 levels, FastAPI's encoder of a 422 that echoes the input), so each server refuses a body
deeper than it reads before any such step."""

from __future__ import annotations

from typing import Any


def deeper_than(document: Any, limit: int) -> bool:
    """Whether `document` nests arrays and objects more than `limit` levels deep (`[]` is one level, `1`
    none). Walked level by level, so the walk itself never recurses, and it stops past the limit."""
    containers = [document] if isinstance(document, dict | list) else []
    for _ in range(limit):
        if not containers:
            return False
        below: list[Any] = []
        for container in containers:
            below += container.values() if isinstance(container, dict) else container
        containers = [item for item in below if isinstance(item, dict | list)]
    return bool(containers)
