"""What real clusters and broken clients send: a malformed body answers 400 with the reason, never 500."""

from __future__ import annotations

import orjson
import pytest

from tests.support.pods import container, pod, review
from tests.webhook.conftest import Webhook

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
    "truncated JSON": (orjson.dumps(review(pod()))[:-20], "body: not valid JSON"),
    "empty body": (b"", "body: not valid JSON"),
    "a JSON list": (b"[1, 2]", "body: Input should be a valid dictionary"),
    "wrong apiVersion": (
        _edited(("apiVersion",), "admission.k8s.io/v2"),
        "apiVersion: Input should be 'admission.k8s.io/v1' or",
    ),
    "wrong kind": (_edited(("kind",), "Pod"), "kind: Input should be 'AdmissionReview'"),
    "no request": (_edited(("request",)), "request: Field required"),
    "missing uid": (_edited(("request", "uid")), "request.uid: Field required"),
    "uid not a string": (_edited(("request", "uid"), 7), "request.uid: Input should be a valid string"),
    "object not a dict": (
        _edited(("request", "object"), "a pod"),
        "request.object: Input should be a valid dictionary",
    ),
    "oldObject a list": (
        _edited(("request", "oldObject"), []),
        "request.oldObject: Input should be a valid dictionary",
    ),
    "unknown operation": (
        _edited(("request", "operation"), "PATCH"),
        "request.operation: Input should be 'CREATE', 'UPDATE', 'DELETE' or 'CONNECT'",
    ),
    "kind not an object": (
        _edited(("request", "kind"), "Pod"),
        "request.kind: Input should be a valid dictionary",
    ),
    "metadata a string": (
        _edited(("request", "object", "metadata"), "x"),
        "request.object.metadata: Input should be a valid dictionary",
    ),
    "annotations a list": (
        _edited(("request", "object", "metadata", "annotations"), ["a"]),
        "request.object.metadata.annotations: Input should be a valid dictionary",
    ),
    "label value a number": (
        _edited(("request", "object", "metadata", "labels"), {"clearml-injector/fraction": 0.5}),
        "request.object.metadata.labels.clearml-injector/fraction: Input should be a valid string",
    ),
    "spec a list": (
        _edited(("request", "object", "spec"), []),
        "request.object.spec: Input should be a valid dictionary",
    ),
    "containers a number": (
        _edited(("request", "object", "spec", "containers"), 3),
        "request.object.spec.containers: Input should be a valid list",
    ),
    "volumes of strings": (
        _edited(("request", "object", "spec", "volumes"), ["data"]),
        "request.object.spec.volumes.0: Input should be a valid dictionary",
    ),
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


def test_update_without_old_object_judges_only_the_new_object(webhook: Webhook) -> None:
    admitted = webhook.admit(pod(container("main", {"nvidia.com/gpu": 1})))
    assert webhook.validate(admitted, operation="UPDATE").allowed
    admitted["spec"]["containers"][0]["volumeMounts"] = [{"name": "gpu-timekeeper-token", "mountPath": "/t"}]
    assert not webhook.validate(admitted, operation="UPDATE").allowed


def _nodes(value: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _nodes(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _nodes(child, (*path, index))
    return found


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_any_node_of_a_review_replaced_by_junk_answers_200_or_400(webhook: Webhook, operation: str) -> None:
    admitted = webhook.admit(pod(container("main", {"nvidia.com/gpu": 1}), init=(container("fetch"),)))
    junk: list[object] = [None, -1.5, "x", [1], {"a": 1}, True]
    for path in ("/mutate", "/validate"):
        original = review(admitted, operation=operation, old=admitted if operation == "UPDATE" else None)
        for node in _nodes(original)[1:]:
            for replacement in junk:
                body = orjson.loads(orjson.dumps(original))
                target = body
                for key in node[:-1]:
                    target = target[key]
                target[node[-1]] = replacement
                answer = webhook.post(path, body)
                assert answer.status_code in (200, 400), (node, replacement, answer.body)
