"""The depth of a parsed body, measured without recursion: exact at every limit, and as deep as orjson
reads without touching Python's stack."""

from __future__ import annotations

import orjson
import pytest

from httpguard.nesting import deeper_than

DEPTHS = {
    "1": 0,
    '"x"': 0,
    "[]": 1,
    "{}": 1,
    "[1, 2]": 1,
    "[[]]": 2,
    '{"a": []}': 2,
    '[1, {"a": {"b": []}}, 2]': 4,
    '[[], [[[]]], {"a": 1}]': 4,
}


@pytest.mark.parametrize(("text", "depth"), DEPTHS.items())
def test_a_document_is_deeper_than_every_limit_below_its_depth(text: str, depth: int) -> None:
    document = orjson.loads(text)

    assert [deeper_than(document, limit) for limit in range(6)] == [limit < depth for limit in range(6)]


@pytest.mark.parametrize(("opening", "closing"), [("[", "]"), ('{"a":', "}")])
def test_as_deep_as_orjson_reads(opening: str, closing: str) -> None:
    document = orjson.loads(opening * 1_024 + "1" + closing * 1_024)

    assert deeper_than(document, 1_023) and not deeper_than(document, 1_024)
