"""A reduced class that frees its GPU (issue 37): preemption waits out its victim's
terminationGracePeriodSeconds, so `/mutate` caps it for a GPU pod admitted at the reduced class
(WEBHOOK_OVER_BUDGET_MAX_GRACE_SECONDS) and `/validate` refuses a final object that lengthens it again."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.support.admission_state_server import StateServer, entry
from tests.support.pods import container, pod
from tests.webhook.conftest import Publish, Tls, Webhook, serve_webhook

YEAR = 365 * 24 * 3600


def gpu_pod(grace: int | None = YEAR, **spec: Any) -> dict[str, Any]:
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return pod(container("main", {"nvidia.com/gpu": 1}), **spec)


@pytest.mark.parametrize(("asked", "stored"), [(YEAR, 30), (31, 30), (30, 30), (5, 5), (0, 0), (None, None)])
def test_a_reduced_gpu_pods_grace_is_capped(
    webhook: Webhook, publish: Publish, asked: int | None, stored: int | None
) -> None:
    publish(namespaces={"team-a": entry("exhausted")})

    admitted = webhook.admit(gpu_pod(asked))

    assert admitted["spec"]["priorityClassName"] == "gpu-over-budget"
    assert admitted["spec"].get("terminationGracePeriodSeconds") == stored
    assert webhook.validate(admitted).allowed


def test_an_in_budget_pod_keeps_its_grace(webhook: Webhook) -> None:
    """In budget its class is not the one preempted first; if it is downgraded later, the reconciler's
    eviction passes the bounded grace (the field is immutable)."""
    admitted = webhook.admit(gpu_pod())

    assert (admitted["spec"]["priorityClassName"], admitted["spec"]["terminationGracePeriodSeconds"]) == (
        "gpu-in-budget",
        YEAR,
    )


def test_a_later_mutation_that_lengthens_it_again_is_denied(webhook: Webhook, publish: Publish) -> None:
    publish(namespaces={"team-a": entry("exhausted")})
    lengthened = copy.deepcopy(webhook.admit(gpu_pod()))
    lengthened["spec"]["terminationGracePeriodSeconds"] = YEAR

    answer = webhook.validate(lengthened)

    assert not answer.allowed
    assert "terminationGracePeriodSeconds=31536000" in answer.message
    assert "frees its GPU within 30 s of its preemption" in answer.message
    assert "rule reduced-grace" in answer.message


def test_the_cap_is_a_setting(tls: Tls, state: StateServer, publish: Publish) -> None:
    publish(namespaces={"team-a": entry("exhausted")})
    with serve_webhook(tls, state, over_budget_max_grace_seconds=5) as served:
        served.wait_until(lambda: served.metric("webhook_state_version") == state.state["version"])

        admitted = served.admit(gpu_pod())

    assert (admitted["spec"]["priorityClassName"], admitted["spec"]["terminationGracePeriodSeconds"]) == (
        "gpu-over-budget",
        5,
    )
