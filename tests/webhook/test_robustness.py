"""What real clusters and broken clients send: a malformed body answers 400 with the reason, never 500."""

from __future__ import annotations

import orjson
import pytest

from tests.support.pods import container, pod
from tests.webhook.conftest import Webhook, review

_DELETE = object()


def _edited(path: tuple[str, ...], value: object = _DELETE) -> bytes:
    """A valid review with the value at `path` replaced, or deleted."""
    body = review(pod(container("main", {"nvidia.com/gpu": 1})))
    target = body
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return orjson.dumps(body)


MALFORMED = {
    "truncated JSON": (orjson.dumps(review(pod()))[:-20], "not valid JSON"),
    "empty body": (b"", "not valid JSON"),
    "a JSON list": (b"[1, 2]", "must be a JSON object"),
    "wrong apiVersion": (_edited(("apiVersion",), "admission.k8s.io/v2"), "apiVersion must be one of"),
    "wrong kind": (_edited(("kind",), "Pod"), "kind must be 'AdmissionReview'"),
    "no request": (_edited(("request",)), "request is missing"),
    "missing uid": (_edited(("request", "uid")), "request.uid is missing"),
    "uid not a string": (_edited(("request", "uid"), 7), "request.uid must be a string"),
    "object not a dict": (_edited(("request", "object"), "a pod"), "request.object must be an object"),
    "oldObject a list": (_edited(("request", "oldObject"), []), "request.oldObject must be an object"),
    "unknown operation": (
        _edited(("request", "operation"), "PATCH"),
        "request.operation must be one of",
    ),
    "kind not an object": (_edited(("request", "kind"), "Pod"), "request.kind must be an object"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_malformed_review_answers_400_with_the_reason(webhook: Webhook, path: str, case: str) -> None:
    body, reason = MALFORMED[case]
    answer = webhook.post(path, body)
    assert answer.status_code == 400
    assert reason in answer.body["detail"]


def test_malformed_requests_are_counted(webhook: Webhook) -> None:
    before = webhook.metric("webhook_malformed_requests_total", endpoint="mutate")
    webhook.post("/mutate", b"{")
    assert webhook.metric("webhook_malformed_requests_total", endpoint="mutate") == before + 1


def test_old_object_absent_or_null_on_create(webhook: Webhook) -> None:
    body = review(webhook.admit(pod(container("main", {"nvidia.com/gpu": 1}))))
    del body["request"]["oldObject"]
    assert webhook.post("/mutate", body).response["allowed"]
    body["request"]["oldObject"] = None
    assert webhook.post("/validate", body).response["allowed"]


def test_strange_but_valid_pod_shapes_are_answered(webhook: Webhook) -> None:
    odd = pod(container("main", {"nvidia.com/gpu": "lots"}))
    assert webhook.mutate(odd).allowed
    answer = webhook.validate(odd)
    assert not answer.allowed and "nvidia.com/gpu=lots: is not a Kubernetes quantity" in answer.message
    empty = review({"apiVersion": "v1", "kind": "Pod"})
    assert webhook.post("/mutate", empty).response["allowed"]
    assert webhook.post("/validate", empty).response["allowed"]


def test_update_without_old_object_is_answered(webhook: Webhook) -> None:
    answer = webhook.validate(pod(container("main", {"nvidia.com/gpu": 1})), operation="UPDATE")
    assert answer.status_code == 200
