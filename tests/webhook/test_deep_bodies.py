"""A review nested deeper than the webhook reads (orjson alone reads 1,024 levels) is a 400 naming the
limit wherever the depth is, never a 500; one just within the limit is answered whatever a patch carries
of it (issue #38)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.support.pods import container, pod, review
from tests.webhook.conftest import Webhook
from tests.webhook.test_robustness import _nodes
from webhook.reviews.review import MAX_REVIEW_DEPTH

DEPTH = 1_000
# Where a built review takes the deep value (orjson writes no more than 255 levels).
_PLACE = "deep value here"
TOO_DEEP = f"body: nested deeper than {MAX_REVIEW_DEPTH} levels"


def _deep(shape: str, depth: int) -> bytes:
    if shape == "arrays":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * (depth - 1) + b"{}" + b"}" * (depth - 1)


def _placed(original: dict[str, Any]) -> Iterator[tuple[dict[str, Any], int]]:
    """The review with _PLACE in place of each node, and added as an unknown member of each object, with
    the level _PLACE is at (the review itself being level 1)."""
    for node in _nodes(original):
        for added in (False, True):
            body = orjson.loads(orjson.dumps(original))
            target = body
            for key in node if added else node[:-1]:
                target = target[key]
            if added and isinstance(target, dict):
                target["deep"] = _PLACE
                yield body, len(node) + 2
            elif not added and node:
                target[node[-1]] = _PLACE
                yield body, len(node) + 1


def _review(operation: str, webhook: Webhook) -> dict[str, Any]:
    admitted = webhook.admit(pod(container("main", {"nvidia.com/gpu": 1}), init=(container("fetch"),)))
    return review(admitted, operation=operation, old=admitted if operation == "UPDATE" else None)


@pytest.mark.parametrize("shape", ["arrays", "objects"])
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_a_deep_body_is_a_400(webhook: Webhook, path: str, shape: str) -> None:
    answer = webhook.post(path, _deep(shape, DEPTH))

    assert answer.status_code == 400, answer.body
    assert answer.body["detail"] == TOO_DEEP


@pytest.mark.parametrize("shape", ["arrays", "objects"])
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_deep_value_anywhere_in_a_review_is_a_400(webhook: Webhook, operation: str, shape: str) -> None:
    """Each node of a GPU pod's review replaced by the deep value, and the deep value added as an unknown
    member of each object: the places the models read, those they ignore, those a patch carries."""
    for body, level in _placed(_review(operation, webhook)):
        text = orjson.dumps(body).replace(orjson.dumps(_PLACE), _deep(shape, DEPTH - level))
        for path in ("/mutate", "/validate"):
            answer = webhook.post(path, text)
            assert (answer.status_code, answer.body.get("detail")) == (400, TOO_DEEP), (path, body)


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_review_as_deep_as_the_limit_is_answered(webhook: Webhook, operation: str) -> None:
    for body, level in _placed(_review(operation, webhook)):
        text = orjson.dumps(body).replace(
            orjson.dumps(_PLACE), _deep("objects", MAX_REVIEW_DEPTH - level + 1)
        )
        for path in ("/mutate", "/validate"):
            answer = webhook.post(path, text)
            assert answer.status_code in (200, 400), (path, body, answer.body)
            assert answer.body.get("detail") != TOO_DEEP
