"""The JSONPatch diff: applied by a JSONPatch library it gives exactly the mutated object."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from webhook.reviews.patch import diff, escape

CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "equal": ({"a": 1, "b": {"c": [1]}}, {"a": 1, "b": {"c": [1]}}),
    "add a key to a nested object": ({"m": {"x": "1"}}, {"m": {"x": "1", "y": "2"}}),
    "add a missing object": ({"m": {}}, {"m": {"annotations": {"k": "v"}}}),
    "replace a scalar": ({"s": {"p": 1}}, {"s": {"p": 2}}),
    "replace a list whole": ({"l": [1, 2]}, {"l": [0, 1, 2]}),
    "remove a key": ({"a": 1, "b": 2}, {"a": 1}),
    "keys with / and ~": ({"ann": {"a/b": "1", "c~d": "2"}}, {"ann": {"a/b": "3", "c~d": "4", "e/f~g": "5"}}),
    "type change": ({"x": {"y": 1}}, {"x": [1]}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_patch_applies_to_the_mutated_object(case: str) -> None:
    original, mutated = CASES[case]
    assert jsonpatch.apply_patch(original, diff(original, mutated)) == mutated


def test_equal_objects_give_no_operations() -> None:
    assert diff({"a": {"b": [1, {"c": 2}]}}, {"a": {"b": [1, {"c": 2}]}}) == []


def test_one_annotation_is_one_operation_with_an_escaped_pointer() -> None:
    original = {"metadata": {"annotations": {"keep": "1"}}}
    mutated = {"metadata": {"annotations": {"keep": "1", "gpu-timekeeper.io/gpu-share": "0.5"}}}
    assert diff(original, mutated) == [
        {"op": "add", "path": "/metadata/annotations/gpu-timekeeper.io~1gpu-share", "value": "0.5"}
    ]


def test_escape_follows_rfc_6901() -> None:
    assert escape("a~/b") == "a~0~1b"
