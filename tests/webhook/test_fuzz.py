"""Property-based fuzzing of `/mutate` and `/validate`: whatever arrives, never a 5xx or an exception.

Hypothesis generates bodies from random JSON to AdmissionReviews of real GPU pods with garbage put anywhere
(quantities like "1.5.3", "-1", "1e400", huge integers, unicode names, wrong types, null in every place).
A body that is not an AdmissionReview answers 400 with the reason; a well-formed review answers 200 with an
AdmissionReview whose `response.uid` is the request's, and a patch the API server could apply. The app runs
in-process (Starlette's TestClient drives its lifespan, so the state poller runs against a real stand-in).
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from typing import Any

import jsonpatch
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from gpuaccounting import names
from tests.support.admission_state_server import entry, run_state_server, snapshot
from tests.support.pods import container, pod, review
from tests.webhook.conftest import Tls
from webhook.serving.app import create_app
from webhook.settings import WebhookSettings

FUZZ = settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ENDPOINTS = st.sampled_from(["/mutate", "/validate"])

# One pod per sharing system (and one already mutated), so garbage lands next to every rule.
PODS = [
    pod(container("main", {"nvidia.com/gpu": 1})),
    pod(container("main", {"nvidia.com/mig-3g.40gb": 2})),
    pod(container("main", {"tencent.com/vcuda-core": 50, "tencent.com/vcuda-memory": 8})),
    pod(container("main", {"cnvrg.io/metagpu": 25})),
    pod(container("main", {"aliyun.com/gpu-mem": 8, "aliyun.com/gpu-count": 1})),
    pod(container("main", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30, "nvidia.com/gpumem": 4096})),
    pod(container("main", {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 50})),
    pod(container("main"), labels={"clearml-injector/fraction": "0.125"}),
    pod(container("main"), annotations={"gpu-fraction": "0.5", "gpu-fraction-container-name": "main"}),
    pod(
        container("main", {"nvidia.com/gpu": 1}),
        init=(container("warmup", {"nvidia.com/gpu": 2}), container("proxy", restartable=True)),
        priorityClassName="gpu-in-budget",
        annotations={names.ANNOTATION_GPU_SHARE: "1"},
    ),
]
QUANTITIES = st.one_of(
    st.sampled_from(
        [
            "1.5.3",
            "-1",
            "1e400",
            "1e-400",
            "0",
            "500m",
            "1Ki",
            "1E3",
            "0x10",
            " 1",
            "1 ",
            "+1",
            ".5",
            "∞",
            "\u0661",
        ]
    ),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(0, 2**70).map(str),
    st.text(max_size=12),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
GARBAGE = QUANTITIES | JSON_VALUES
DELETE = object()


def paths(document: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON document a value could be replaced or deleted."""
    children = (
        document.items()
        if isinstance(document, dict)
        else enumerate(document)
        if isinstance(document, list)
        else ()
    )
    for key, child in children:
        yield (*prefix, key)
        yield from paths(child, (*prefix, key))


@st.composite
def damaged(draw: st.DrawFn, document: Any, edits: int = 3) -> Any:
    """The document with up to `edits` values replaced by garbage (a quantity, any JSON) or deleted."""
    document = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, edits))):
        places = list(paths(document))
        if not places:
            break
        *parents, last = draw(st.sampled_from(places))
        target = document
        for key in parents:
            target = target[key]
        value = draw(GARBAGE | st.just(DELETE))
        if value is DELETE:
            del target[last]
        else:
            target[last] = value
    return document


ODD_TEXT = (
    st.sampled_from(["1.5.3", "-1", "1e400", "0", "500m", "1Ki", "", " ", "∞", "\u0661", "0.1250"])
    | st.text()
)
ODD_NUMBERS = st.integers(min_value=-(2**80), max_value=2**80) | st.floats(
    allow_nan=False, allow_infinity=False
)
# Maps whose values Kubernetes types as strings (or quantities): never null there.
STRING_MAPS = {"labels", "annotations", "requests", "limits"}


@st.composite
def odd_but_valid(draw: st.DrawFn, document: Any, edits: int = 4) -> Any:
    """The document with up to `edits` values replaced by odd values of the same type (a text by any text,
    a number by any number, a field by null) or deleted: still a Pod as the API server types it."""
    document = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, edits))):
        places = list(paths(document))
        if not places:
            break
        *parents, last = draw(st.sampled_from(places))
        target = document
        for key in parents:
            target = target[key]
        current = target[last]
        in_string_map = bool(parents) and parents[-1] in STRING_MAPS
        if isinstance(current, str):
            options = ODD_TEXT if in_string_map or isinstance(target, list) else ODD_TEXT | st.none()
        elif isinstance(current, int | float):
            options = ODD_NUMBERS | ODD_TEXT if in_string_map else ODD_NUMBERS
        else:
            options = st.none() if isinstance(target, dict) and not in_string_map else st.nothing()
        value = draw(options | st.just(DELETE))
        if value is DELETE:
            del target[last]
        else:
            target[last] = value
    return document


@st.composite
def reviews(draw: st.DrawFn, damage: Any) -> dict[str, Any]:
    """AdmissionReviews as the API server sends them, about one of PODS changed by `damage`."""
    original = draw(st.sampled_from(PODS))
    operation = draw(st.sampled_from(["CREATE", "CREATE", "UPDATE", "DELETE", "CONNECT"]))
    body = review(original, operation=operation, dry_run=draw(st.booleans()))
    request = body["request"]
    request["object"] = draw(damage(original))
    if operation == "UPDATE":
        request["oldObject"] = draw(st.none() | damage(draw(st.sampled_from(PODS))))
    request["namespace"] = draw(st.sampled_from(["team-a", "capped", "exhausted", "", "tëam-ü"]))
    request["uid"] = draw(st.text(min_size=1, max_size=40))
    return body


@pytest.fixture(scope="module")
def client(tls: Tls) -> Iterator[TestClient]:
    namespaces = {
        "capped": entry("in_budget", 0.5),
        "exhausted": entry("exhausted"),
    }
    with run_state_server(snapshot(namespaces=namespaces)) as state:
        settings = WebhookSettings(
            timekeeper_url=state.url,
            tls_cert_file=tls.cert_file,
            tls_key_file=tls.key_file,
            watch_priority_classes=False,
        )
        with TestClient(create_app(settings), raise_server_exceptions=True) as client:
            yield client


def encoded(value: Any) -> bytes:
    """JSON as a client may write it: integers of any size (orjson would refuse beyond 64 bits)."""
    return json.dumps(value).encode()


def post(client: TestClient, path: str, body: bytes) -> Any:
    return client.post(path, content=body, headers={"Content-Type": "application/json"})


def assert_answered(response: Any, sent: dict[str, Any]) -> dict[str, Any]:
    """A 200 AdmissionReview for this request, whose patch (if any) applies to the object sent."""
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["apiVersion"] == sent["apiVersion"]
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == sent["request"]["uid"]
    assert isinstance(answer["response"]["allowed"], bool)
    if "patch" in answer["response"]:
        patch = orjson.loads(base64.b64decode(answer["response"]["patch"]))
        jsonpatch.apply_patch(sent["request"]["object"], patch)
    if not answer["response"]["allowed"]:
        assert answer["response"]["status"]["message"]
    return answer


@FUZZ
@given(path=ENDPOINTS, body=st.binary(max_size=80) | JSON_VALUES.map(encoded))
def test_a_body_that_is_not_an_admission_review_answers_400(
    client: TestClient, path: str, body: bytes
) -> None:
    response = post(client, path, body)

    assert response.status_code == 400, response.text
    assert response.json()["detail"]


@FUZZ
@given(path=ENDPOINTS, body=damaged(review(PODS[0]), edits=2))
def test_a_damaged_envelope_answers_400_or_an_admission_review(
    client: TestClient, path: str, body: dict[str, Any]
) -> None:
    response = post(client, path, encoded(body))

    if response.status_code == 400:
        assert response.json()["detail"]
    else:
        assert_answered(response, body)


@FUZZ
@given(path=ENDPOINTS, body=reviews(odd_but_valid))
def test_a_review_of_a_pod_with_odd_values_answers_200_with_its_uid(
    client: TestClient, path: str, body: dict[str, Any]
) -> None:
    """Quantities like "1.5.3", "-1", "1e400" or 2**80, unicode names, null fields: denied or allowed."""
    assert_answered(post(client, path, encoded(body)), body)


@FUZZ
@given(path=ENDPOINTS, body=reviews(damaged))
def test_a_review_of_a_pod_with_garbage_answers_200_or_400_naming_the_place(
    client: TestClient, path: str, body: dict[str, Any]
) -> None:
    """Wrong types anywhere in the object: a Pod the webhook cannot read is a malformed review."""
    response = post(client, path, encoded(body))

    if response.status_code == 400:
        assert response.json()["detail"].startswith(("request.object.", "request.oldObject."))
    else:
        assert_answered(response, body)
