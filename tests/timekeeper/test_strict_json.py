"""The strict JSON reading of request bodies: a repeated key is found by counting members (no second
parse of every body), and it refuses exactly what the standard parser with a duplicate check refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timekeeper.routing import MAX_BODY_DEPTH, _unique_keys, loads_strict

_TEXT = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=6)
# Keys that hold what could fool a count of ':' (colons, quotes, backslashes, escapes), or collide.
_KEYS = st.one_of(st.sampled_from(["a", "b", "a:b", ":", '"', '":"', "\\", "\\:", "ü", "\n"]), _TEXT)
_SPACE = st.sampled_from(["", " ", "\n\t "])


def _scalar(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    _TEXT,
).map(_scalar)


def _object(pairs: list[tuple[str, str, str]]) -> str:
    return (
        "{"
        + ",".join(
            f"{json.dumps(key, ensure_ascii=ascii_)}{space}:{space}{value}"
            for key, value, space, ascii_ in pairs
        )
        + "}"
    )


_DOCUMENTS = st.recursive(
    _SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4).map(lambda items: "[" + ",".join(items) + "]"),
        st.lists(st.tuples(_KEYS, children, _SPACE, st.booleans()), max_size=4).map(_object),
    ),
    max_leaves=12,
)


def _standard(text: str) -> Any:
    return json.loads(text, object_pairs_hook=_unique_keys)


# As the other fuzz tests: the same examples every run (20,000 random ones found nothing to add), and no
# per-example deadline, which a loaded machine's scheduling pause would miss ("Unreliable test timings").
@settings(derandomize=True, deadline=None)
@given(_DOCUMENTS)
def test_a_document_is_refused_exactly_when_a_key_repeats_in_one_object(document: str) -> None:
    try:
        expected = _standard(document)
    except ValueError:
        with pytest.raises(json.JSONDecodeError):
            loads_strict(document.encode())
    else:
        assert loads_strict(document.encode()) == expected


@pytest.mark.parametrize(
    "body",
    [
        b'{"a":1,"a":1}',
        b'{"t":"12:00:00Z","x":{"k:":1,"k:":2}}',
        b'[{"a":"\\":","a":0}]',
        b'{"gpus":[{"uuid":"GPU-0","uuid":"GPU-1"}]}',
    ],
)
def test_a_repeated_key_is_named(body: bytes) -> None:
    with pytest.raises(json.JSONDecodeError, match="duplicate key"):
        loads_strict(body)


def test_colons_and_escaped_quotes_inside_strings_are_not_members() -> None:
    body = b'{"a":"x:y\\":z","b\\\\":[{"c":"12:00:00Z"}],"d:":":"}'

    assert loads_strict(body) == {"a": 'x:y":z', "b\\": [{"c": "12:00:00Z"}], "d:": ":"}


def test_a_body_without_repeated_keys_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    def second_parse(*args: object, **kwargs: object) -> None:
        raise AssertionError("parsed a second time")

    monkeypatch.setattr(json, "loads", second_parse)
    body = (
        b'{"namespace":"a","t":"2026-03-18T12:00:00Z",'
        b'"gpus":[{"uuid":"GPU-0","sm_util_pct":50.0}],"q":"\\":"}'
    )

    assert loads_strict(body)["gpus"] == [{"uuid": "GPU-0", "sm_util_pct": 50.0}]


@pytest.mark.parametrize(("opening", "closing"), [("[", "]"), ('{"a":', "}")])
def test_a_body_is_read_to_the_depth_limit_and_refused_beyond(opening: str, closing: str) -> None:
    def nested(depth: int, inner: str = "1") -> bytes:
        return (opening * depth + inner + closing * depth).encode()

    assert loads_strict(nested(MAX_BODY_DEPTH)) is not None
    with pytest.raises(json.JSONDecodeError, match=f"nested deeper than {MAX_BODY_DEPTH} levels"):
        loads_strict(nested(MAX_BODY_DEPTH + 1))
    # As deep as orjson reads, a repeated key at the bottom: refused for its depth, before the standard
    # parser (which recurses once per level) would name the key.
    with pytest.raises(json.JSONDecodeError, match="nested deeper"):
        loads_strict(nested(1_000, inner='{"b":1,"b":2}'))
