"""What the fuzzer (test_fuzz.py) found, pinned as concrete examples: each was a 500 (or a hang)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuaccounting.quantity import QuantityError, parse_decimal, parse_quantity
from tests.support.pods import container, pod, review
from tests.webhook.conftest import Webhook

GPU_POD = pod(container("main", {"nvidia.com/gpu": 1}))


def _with(path: tuple[Any, ...], value: Any, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """A review of GPU_POD with the value at `path` replaced."""
    body = body or review(pod(container("main", {"nvidia.com/gpu": 1})))
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return body


MALFORMED = {
    "apiVersion a list": (
        _with(("apiVersion",), ["admission.k8s.io/v1"]),
        "apiVersion: Input should be 'admission.k8s.io/v1' or",
    ),
    "operation an object": (
        _with(("request", "operation"), {"CREATE": 1}),
        "request.operation: Input should be 'CREATE', 'UPDATE', 'DELETE' or 'CONNECT'",
    ),
    "metadata a string": (
        _with(("request", "object", "metadata"), "work"),
        "request.object.metadata: Input should be a valid dictionary",
    ),
    "annotations a list": (
        _with(("request", "object", "metadata", "annotations"), ["a"]),
        "request.object.metadata.annotations: Input should be a valid dictionary",
    ),
    "containers a number": (
        _with(("request", "object", "spec", "containers"), 5),
        "request.object.spec.containers: Input should be a valid list",
    ),
    "a container a string": (
        _with(("request", "object", "spec", "containers"), ["main"]),
        "request.object.spec.containers.0: Input should be a valid dictionary",
    ),
    "requests a list": (
        _with(("request", "object", "spec", "containers", 0, "resources", "requests"), [1]),
        "request.object.spec.containers.0.resources.requests: Input should be a valid dictionary",
    ),
    "volumes of numbers": (
        _with(("request", "object", "spec", "volumes"), [1]),
        "request.object.spec.volumes.0: Input should be a valid dictionary",
    ),
    "oldObject spec a list": (
        _with(("request", "oldObject"), {"spec": []}, review(GPU_POD, operation="UPDATE")),
        "request.oldObject.spec: Input should be a valid dictionary",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_a_review_the_webhook_cannot_read_answers_400_naming_the_place(
    webhook: Webhook, path: str, case: str
) -> None:
    body, reason = MALFORMED[case]
    answer = webhook.post(path, body)

    assert answer.status_code == 400, answer.body
    assert reason in answer.body["detail"]


OUT_OF_RANGE = {
    "gpus beyond a float": (pod(container("main", {"nvidia.com/gpu": "1e400"})), "rule quantity"),
    "gpus beyond int64": (pod(container("main", {"nvidia.com/gpu": 2**63})), "rule quantity"),
    "exponent beyond Decimal": (pod(container("main", {"nvidia.com/gpu": "1e99999999"})), "rule quantity"),
    "ClearML fraction beyond a float": (
        pod(container("main"), labels={"clearml-injector/fraction": "1e400"}),
        "rule clearml-fraction",
    ),
    "ClearML fraction with a billion-digit exponent": (
        pod(container("main"), labels={"clearml-injector/fraction": "1e999999999"}),
        "rule clearml-fraction",
    ),
    "KAI fraction below a nano": (
        pod(container("main"), annotations={"gpu-fraction": "1e-999999999"}),
        "rule kai-fraction",
    ),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_a_request_beyond_kubernetes_range_is_denied_not_a_crash(webhook: Webhook, case: str) -> None:
    odd, rule = OUT_OF_RANGE[case]

    assert webhook.mutate(odd).status_code == 200
    answer = webhook.validate(odd)
    assert not answer.allowed
    assert rule in answer.message


@pytest.mark.parametrize("value", ["1e400", 2**63, -(2**63), "8Ei", "1e99999999", "1e-99999999", "0.1n"])
def test_a_quantity_beyond_kubernetes_range_is_refused(value: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)


@pytest.mark.parametrize(("value", "largest"), [("7Ei", 7 * 2**60), (2**63 - 1, 2**63 - 1), ("1n", "1e-9")])
def test_the_edges_of_kubernetes_range_are_quantities(value: object, largest: object) -> None:
    assert parse_quantity(value) == parse_decimal(largest)


@pytest.mark.parametrize(
    "value", ["1e400", "1e999999999", "-1e999999999", "1e-999999999", "NaN", "Infinity", "x"]
)
def test_a_decimal_label_beyond_kubernetes_range_is_refused(value: str) -> None:
    with pytest.raises(QuantityError):
        parse_decimal(value)
