"""The admission endpoint counts what the decisions answer: the decisions themselves touch no metric.

A mutation of a GPU pod hands its priority decision back in its answer; the endpoint counts the admission
by result and the decision by rule, and logs a denial, for a real review only: a dryRun review is
answered alike and leaves no count and no log line. The app runs in-process (no lifespan: the budget
state is stored in its cache directly).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from typing import Any

import jsonpatch
import orjson
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from gpuaccounting.admission_state import AdmissionSnapshot
from tests.support.admission_state_server import entry, snapshot
from tests.support.pods import container, pod, review
from webhook.decisions.priority import PriorityRule
from webhook.reviews.review import parse_review
from webhook.serving.app import create_app
from webhook.settings import WebhookSettings

STATE: AdmissionSnapshot = snapshot(
    namespaces={"team-a": entry("in_budget"), "team-x": entry("exhausted"), "team-s": entry("in_budget")}
)
GPU_POD = pod(container("main", {"nvidia.com/gpu": 1}))


@pytest.fixture
def app() -> Starlette:
    built = create_app(WebhookSettings(watch_priority_classes=False))
    built.state.cache.store(STATE, '"1"')
    return built


@pytest.fixture
def client(app: Starlette) -> Iterator[TestClient]:
    yield TestClient(app)  # not entered: no lifespan, no poller


def _count(app: Starlette, name: str, **labels: str) -> float:
    return app.state.metrics.registry.get_sample_value(name, labels) or 0.0


def _post(client: TestClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = client.post(path, content=orjson.dumps(body), headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    response: dict[str, Any] = answer.json()["response"]
    return response


def _rules(app: Starlette) -> dict[str, float]:
    return {
        rule.value: _count(app, "webhook_priority_decisions_total", rule=rule.value) for rule in PriorityRule
    }


def test_a_dry_run_mutation_is_answered_alike_and_not_counted(app: Starlette, client: TestClient) -> None:
    dry = _post(client, "/mutate", review(GPU_POD, dry_run=True))
    assert dry["allowed"] and dry["patch"]
    assert (
        _count(app, "webhook_admissions_total", endpoint="mutate", operation="CREATE", result="patched") == 0
    )
    assert set(_rules(app).values()) == {0.0}
    real = _post(client, "/mutate", review(GPU_POD))
    assert real["patch"] == dry["patch"]
    assert (
        _count(app, "webhook_admissions_total", endpoint="mutate", operation="CREATE", result="patched") == 1
    )
    assert _rules(app) == {**dict.fromkeys(_rules(app), 0.0), "in-budget": 1.0}


@pytest.mark.parametrize(
    ("namespace", "priority_class", "rule"),
    [
        ("team-a", None, PriorityRule.IN_BUDGET),
        ("team-x", None, PriorityRule.EXHAUSTED),
        ("team-a", "gpu-over-budget", PriorityRule.IN_BUDGET),  # ours: never a user's choice
    ],
)
def test_real_mutations_are_counted_by_the_rule_that_applied(
    app: Starlette, client: TestClient, namespace: str, priority_class: str | None, rule: PriorityRule
) -> None:
    spec = {"priorityClassName": priority_class} if priority_class else {}
    gpu_pod = pod(container("main", {"nvidia.com/gpu": 1}), namespace=namespace, **spec)
    for _ in range(2):
        _post(client, "/mutate", review(gpu_pod, dry_run=True))
    for _ in range(3):
        _post(client, "/mutate", review(gpu_pod))
    assert _rules(app) == {**dict.fromkeys(_rules(app), 0.0), rule.value: 3.0}


def test_a_re_invoked_pod_is_counted_unchanged_with_its_decision(app: Starlette, client: TestClient) -> None:
    """The second pass of a mutated pod patches nothing; its decision still counts once more."""
    first = _post(client, "/mutate", review(GPU_POD))
    mutated = jsonpatch.apply_patch(GPU_POD, orjson.loads(base64.b64decode(first["patch"])))
    again = _post(client, "/mutate", review(mutated))
    assert "patch" not in again
    assert (
        _count(app, "webhook_admissions_total", endpoint="mutate", operation="CREATE", result="unchanged")
        == 1
    )
    assert _rules(app)["in-budget"] == 2


def test_a_non_gpu_pod_is_counted_without_a_priority_decision(app: Starlette, client: TestClient) -> None:
    _post(client, "/mutate", review(pod(container("main"))))
    assert (
        _count(app, "webhook_admissions_total", endpoint="mutate", operation="CREATE", result="non_gpu") == 1
    )
    assert set(_rules(app).values()) == {0.0}


def test_a_dry_run_denial_is_not_counted_or_logged(
    app: Starlette, client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.admission")
    broken = pod(container("main", {"tencent.com/vcuda-core": 150, "tencent.com/vcuda-memory": 8}))
    assert not _post(client, "/validate", review(broken, dry_run=True))["allowed"]
    assert (
        _count(app, "webhook_admissions_total", endpoint="validate", operation="CREATE", result="denied") == 0
    )
    assert not [r for r in caplog.records if r.message == "admission_denied"]
    assert not _post(client, "/validate", review(broken))["allowed"]
    assert (
        _count(app, "webhook_admissions_total", endpoint="validate", operation="CREATE", result="denied") == 1
    )
    assert [r.message for r in caplog.records].count("admission_denied") == 1


def test_the_decisions_themselves_count_nothing(app: Starlette) -> None:
    """Called directly (as the endpoint does), a mutation returns its priority decision and leaves the
    metrics as they were: counting is the endpoint's alone."""
    request = parse_review(orjson.dumps(review(GPU_POD))).request
    before = app.state.metrics.registry.collect
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in before() for s in m.samples}
    answer = app.state.admission.mutate(request)
    assert answer.result == "patched"
    assert answer.priority is not None and answer.priority.rule is PriorityRule.IN_BUDGET
    assert app.state.admission.validate(request).priority is None
    after = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in before() for s in m.samples}
    assert {k: v for k, v in after.items() if not k[0].startswith("webhook_state_age")} == {
        k: v for k, v in samples.items() if not k[0].startswith("webhook_state_age")
    }


def test_every_counters_known_label_sets_start_at_zero() -> None:
    """A series born at its first event has no earlier sample: rate() would miss the first burst, and a
    dashboard panel would stay blank until then."""
    with TestClient(create_app(WebhookSettings(watch_priority_classes=False))) as entered:
        metrics = entered.app.state.metrics.registry  # type: ignore[attr-defined]

        def value(name: str, **labels: str) -> float | None:
            return metrics.get_sample_value(name, labels)

        for result in ("updated", "not_modified", "error"):  # the poller runs: some may have counted
            assert value("webhook_state_polls_total", result=result) is not None
        for rule in PriorityRule:
            assert value("webhook_priority_decisions_total", rule=rule.value) == 0
        for endpoint in ("mutate", "validate"):
            assert (
                value("webhook_admissions_total", endpoint=endpoint, operation="CREATE", result="denied") == 0
            )
            assert value("webhook_admission_duration_seconds_count", endpoint=endpoint) == 0
