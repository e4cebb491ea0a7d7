"""Budget state: polled in the background with ETags; the documented policy when stale or missing."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuaccounting import names
from gpuaccounting.backoff import Backoff
from tests.support.admission_state_server import entry, run_state_server, snapshot
from tests.support.pods import container, pod
from tests.webhook.conftest import Tls, Webhook, serve_webhook
from webhook.metrics import WebhookMetrics
from webhook.settings import WebhookSettings
from webhook.watches.budgetcache import BudgetStateCache, BudgetStatePoller

EXHAUSTED = {"team-a": entry("exhausted")}


def decision(webhook: Webhook) -> tuple[str, str, str]:
    patched = webhook.admit(pod(container("main", {"nvidia.com/gpu": 1})))
    annotations = patched["metadata"]["annotations"]
    return (
        patched["spec"]["priorityClassName"],
        annotations[names.ANNOTATION_BUDGET_STATE],
        annotations[names.ANNOTATION_PRIORITY_DECISION],
    )


def test_polls_send_the_last_etag_and_a_fresh_token_each_time(tls: Tls, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first-token\n")
    with (
        run_state_server(snapshot(version=3)) as state,
        serve_webhook(tls, state, timekeeper_token_file=token) as hook,
    ):
        hook.wait_until(lambda: hook.metric("webhook_state_polls_total", result="not_modified") >= 1)
        token.write_text("rotated-token\n")
        hook.wait_until(lambda: state.seen[-1].get("Authorization") == "Bearer rotated-token")
        assert state.seen[0].get("If-None-Match") is None
        assert state.seen[-1].get("If-None-Match") == '"3"'
        assert state.seen[0]["Authorization"] == "Bearer first-token"
        assert hook.metric("webhook_state_polls_total", result="updated") == 1


def test_an_unreadable_token_file_is_a_failed_poll_and_the_poller_carries_on(
    tls: Tls, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_bytes(b"\xff\xfe not text")
    with (
        run_state_server(snapshot(version=4)) as state,
        serve_webhook(tls, state, timekeeper_token_file=token) as hook,
    ):
        hook.wait_until(lambda: hook.metric("webhook_state_polls_total", result="error") >= 2)
        assert hook.metric("webhook_state_version") == 0
        token.write_text("fixed-token")
        hook.wait_until(lambda: hook.metric("webhook_state_version") == 4)
        assert state.seen[-1]["Authorization"] == "Bearer fixed-token"


def test_state_never_loaded_is_treated_as_in_budget_and_counted(tls: Tls) -> None:
    with run_state_server(None) as state, serve_webhook(tls, state) as hook:
        assert decision(hook) == (
            "gpu-in-budget",
            "unknown",
            "in-budget: no class chosen; state never loaded, missing-state policy in_budget",
        )
        assert hook.metric("webhook_state_missing_decisions_total") == 1
        assert hook.metric("webhook_state_age_seconds") == -1
        hook.wait_until(lambda: hook.metric("webhook_state_polls_total", result="error") >= 1)
        # Once the timekeeper answers, decisions follow its state.
        state.publish(snapshot(version=1, namespaces=EXHAUSTED))
        hook.wait_until(lambda: hook.metric("webhook_state_version") == 1)
        assert decision(hook) == ("gpu-over-budget", "exhausted", "exhausted: namespace exhausted")


def test_missing_state_policy_is_configurable(tls: Tls) -> None:
    with (
        run_state_server(None) as state,
        serve_webhook(tls, state, missing_state_policy="over_budget") as hook,
    ):
        assert decision(hook)[0] == "gpu-over-budget"


def wait_until_stale(hook: Webhook, state: Any) -> None:
    hook.wait_until(lambda: hook.metric("webhook_state_version") == state.state["version"])
    state.failing = True
    hook.wait_until(lambda: hook.metric("webhook_state_age_seconds") > hook.settings.state_max_age_seconds)


def test_stale_state_decides_with_the_last_known_state_counted_and_logged_once(
    tls: Tls, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="webhook.priority")
    with (
        run_state_server(snapshot(namespaces=EXHAUSTED)) as state,
        serve_webhook(tls, state, state_max_age_seconds=0.3) as hook,
    ):
        wait_until_stale(hook, state)
        assert decision(hook) == (
            "gpu-over-budget",
            "exhausted",
            "exhausted: namespace exhausted; stale state, last known exhausted",
        )
        assert hook.metric("webhook_state_stale_decisions_total") == 1
        # The answer is the same on re-invocation: the reason carries no clock.
        patched = hook.admit(pod(container("main", {"nvidia.com/gpu": 1})))
        assert hook.mutate(patched).patch == []
        assert hook.metric("webhook_state_stale_decisions_total") == 3
        # A namespace the last snapshot did not name is governed by its default, stale too.
        other = hook.admit(pod(container("main", {"nvidia.com/gpu": 1}), namespace="team-b"))
        assert other["spec"]["priorityClassName"] == "gpu-in-budget"
    assert [r.message for r in caplog.records].count("admission_state_stale") == 1


def test_a_malformed_snapshot_keeps_the_last_good_one(tls: Tls) -> None:
    with (
        run_state_server(snapshot(version=1, namespaces=EXHAUSTED)) as state,
        serve_webhook(tls, state) as hook,
    ):
        hook.wait_until(lambda: hook.metric("webhook_state_version") == 1)
        state.body_override = b'{"version": "two", "namespaces": []}'
        state.publish(snapshot(version=2))
        hook.wait_until(lambda: hook.metric("webhook_state_polls_total", result="error") >= 2)
        assert hook.metric("webhook_state_version") == 1
        assert decision(hook)[0] == "gpu-over-budget"


def test_health_and_metrics_endpoints(webhook: Webhook) -> None:
    assert webhook.client.get(f"{webhook.url}/healthz").json() == {"status": "ok"}
    webhook.mutate(pod(container("web")))
    assert (
        webhook.metric("webhook_admissions_total", endpoint="mutate", operation="CREATE", result="non_gpu")
        >= 1
    )


async def test_failed_polls_back_off_and_a_good_one_returns_to_the_interval() -> None:
    settings = WebhookSettings(state_poll_interval_seconds=10, state_poll_retry_max_seconds=8)
    cache = BudgetStateCache(settings.state_max_age_seconds)
    async with httpx.AsyncClient() as client:
        poller = BudgetStatePoller(
            settings, cache, WebhookMetrics(cache.age_seconds), client, Backoff(1, 8, rng=lambda: 1.0)
        )
        waits = [poller.next_wait(result) for result in ("error", "error", "error", "error", "error")]
        assert waits == [1, 2, 4, 8, 8]  # the backoff's bound (rng at its top), capped, not the interval
        assert poller.next_wait("not_modified") == 10
        assert poller.next_wait("error") == 1  # a good poll started the run over


def test_a_namespace_the_snapshot_leaves_out_is_governed_by_the_default() -> None:
    cache = BudgetStateCache(60)
    own = entry("exhausted", 0.5, user_classes="replace")
    cache.store(snapshot(namespaces={"team-a": own}, default=entry("in_budget", 2.0)), '"1"')

    assert cache.view("team-a").admission == own
    assert cache.view("team-b").admission == entry("in_budget", 2.0)


async def test_a_snapshot_naming_a_policy_it_does_not_list_is_refused_and_the_last_one_kept() -> None:
    broken = snapshot(version=2, namespaces={"team-a": entry("in_budget", 1.0)})
    broken["namespaces"]["team-a"]["priority_policy"] = len(broken["priority_policies"])
    settings = WebhookSettings()
    cache = BudgetStateCache(settings.state_max_age_seconds)
    with run_state_server(snapshot(version=1, namespaces=EXHAUSTED)) as state:
        async with httpx.AsyncClient() as client:
            poller = BudgetStatePoller(
                settings.model_copy(update={"timekeeper_url": state.url}),
                cache,
                WebhookMetrics(cache.age_seconds),
                client,
            )
            assert await poller.poll_once() == "updated"
            state.publish(broken)
            assert await poller.poll_once() == "error"

    assert cache.etag == '"1"'
    view = cache.view("team-a")
    assert view.admission is not None and view.admission["state"] == "exhausted"


def test_a_members_polls_name_its_cluster_and_a_single_clusters_name_none(tls: Tls) -> None:
    """In a fleet the hub reviews the poll's token with the named cluster's API server and answers that
    cluster's namespaces (docs/fleet.md); a single cluster's webhook sends no such header."""
    with run_state_server(snapshot(version=2)) as state, serve_webhook(tls, state, cluster="eu-b") as hook:
        hook.wait_until(lambda: len(state.seen) >= 2)
        assert {seen.get(names.CLUSTER_HEADER) for seen in state.seen} == {"eu-b"}
    with run_state_server(snapshot(version=2)) as state, serve_webhook(tls, state) as hook:
        hook.wait_until(lambda: len(state.seen) >= 2)
        assert {names.CLUSTER_HEADER.lower()} & {key.lower() for seen in state.seen for key in seen} == set()
