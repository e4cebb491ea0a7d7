"""JSONPatch (RFC 6902) by diffing the pod before and after mutation: objects key by key (one annotation, one
operation), anything else replaced whole."""

from __future__ import annotations

from typing import Any


def escape(token: str) -> str:
    """A key as a JSON-pointer token (RFC 6901): `~` and `/` escaped, as annotation keys need."""
    return token.replace("~", "~0").replace("/", "~1")


def diff(original: dict[str, Any], mutated: dict[str, Any], path: str = "") -> list[dict[str, Any]]:
    """The operations that turn `original` into `mutated`; empty when they are equal."""
    operations: list[dict[str, Any]] = []
    for key, old in original.items():
        if key not in mutated:
            operations.append({"op": "remove", "path": f"{path}/{escape(key)}"})
            continue
        new = mutated[key]
        if old == new:
            continue
        pointer = f"{path}/{escape(key)}"
        if isinstance(old, dict) and isinstance(new, dict):
            operations.extend(diff(old, new, pointer))
        else:
            operations.append({"op": "replace", "path": pointer, "value": new})
    for key, new in mutated.items():
        if key not in original:
            operations.append({"op": "add", "path": f"{path}/{escape(key)}", "value": new})
    return operations
