"""The priority policy over real HTTPS, with the PriorityClasses watched through the real kubernetes_asyncio
client from an API server (the stand-in of tests/support, holding the RBAC deployment/ ships: the webhook
runs as its own ServiceAccount, so a missing rule fails these tests)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuaccounting import names
from tests.support.admission_state_server import StateServer, entry, run_state_server, snapshot
from tests.support.kube_apiserver import KubeApiServer
from tests.support.kube_rbac import TIMEKEEPER_NAMESPACE, deployment_rbac
from tests.support.pods import container, pod
from tests.webhook.conftest import Tls, Webhook, serve_webhook

CLASSES = {
    # Our classes at numbers other than the settings' fallback (1000 / 100): what is written is theirs.
    "gpu-in-budget": (1200, "PreemptLowerPriority", False),
    "gpu-over-budget": (120, "Never", False),
    "default-batch": (5000, "PreemptLowerPriority", True),
    "high": (100000, "PreemptLowerPriority", False),
    "low": (500, "PreemptLowerPriority", False),
    "system-node-critical": (2000001000, "PreemptLowerPriority", False),
}


def priority_class(name: str, value: int, preemption: str, global_default: bool) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "preemptionPolicy": preemption,
        "globalDefault": global_default,
    }


@pytest.fixture(scope="module")
def cluster() -> Iterator[KubeApiServer]:
    server = KubeApiServer().start()
    for obj in deployment_rbac():
        if obj["kind"] != "ServiceAccount":
            server.put(obj)
    for name, spec in CLASSES.items():
        server.put(priority_class(name, *spec))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def state() -> Iterator[StateServer]:
    namespaces = {
        "spent": entry("exhausted"),
        "strict": entry("in_budget", user_classes="replace"),
        "generous": entry("in_budget", ceiling=100000),
    }
    with run_state_server(snapshot(namespaces=namespaces)) as served:
        yield served


@pytest.fixture(scope="module")
def hook(
    tls: Tls, cluster: KubeApiServer, state: StateServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Webhook]:
    token = cluster.add_service_account_token(TIMEKEEPER_NAMESPACE, "gpu-timekeeper-webhook")
    kubeconfig = cluster.write_kubeconfig(tmp_path_factory.mktemp("kube") / "kubeconfig", token)
    # Exempt classes are exempt in `spent` too (an admin's list), so one exhausted namespace shows both.
    with serve_webhook(
        tls,
        state,
        watch_priority_classes=True,
        kubeconfig=kubeconfig,
        kube_retry_max_seconds=0.1,
        exempt_namespaces={"*": ["kube-system", "spent"]},
    ) as served:
        served.wait_until(
            lambda: (
                served.metric("webhook_priority_classes") == len(CLASSES)
                and served.metric("webhook_state_version") == 1
            )
        )
        yield served


def admit(hook: Webhook, namespace: str, priority_class_name: str | None) -> tuple[Any, ...]:
    """What the API server hands us after its Priority plugin ran: the class and its value filled in."""
    spec: dict[str, Any] = {}
    if priority_class_name is not None:
        spec = {"priorityClassName": priority_class_name, "priority": CLASSES[priority_class_name][0]}
    original = pod(container("main", {"nvidia.com/gpu": 1}), namespace=namespace, **spec)
    patched = hook.admit(original)
    assert hook.mutate(patched).patch == [], "a re-invocation changes nothing"
    decision = patched["metadata"]["annotations"][names.ANNOTATION_PRIORITY_DECISION]
    result = patched["spec"]
    return result.get("priorityClassName"), result.get("priority"), result.get("preemptionPolicy"), decision


def test_global_default_class_in_an_exhausted_namespace_gets_the_reduced_class(hook: Webhook) -> None:
    assert admit(hook, "spent", "default-batch") == (
        "gpu-over-budget",
        120,
        "Never",
        "exhausted: namespace exhausted; globalDefault class default-batch replaced",
    )


def test_user_class_in_an_exhausted_namespace_gets_the_reduced_class(hook: Webhook) -> None:
    assert admit(hook, "spent", "high") == (
        "gpu-over-budget",
        120,
        "Never",
        "exhausted: namespace exhausted; class high replaced",
    )


def test_exempt_class_is_kept_in_an_exhausted_namespace(hook: Webhook) -> None:
    original = pod(
        container("main", {"nvidia.com/gpu": 1}),
        namespace="spent",
        priorityClassName="system-node-critical",
        priority=2000001000,
    )
    patch = hook.mutate(original).patch
    assert not [op for op in patch if op["path"].startswith(("/spec/priority", "/spec/preemptionPolicy"))]
    assert admit(hook, "spent", "system-node-critical") == (
        "system-node-critical",
        2000001000,
        None,
        "exempt: class system-node-critical is exempt",
    )


def test_in_budget_global_default_or_no_class_gets_the_in_budget_class(hook: Webhook) -> None:
    in_budget = ("gpu-in-budget", 1200, "PreemptLowerPriority")
    assert admit(hook, "team-a", None) == (*in_budget, "in-budget: no class chosen")
    assert admit(hook, "team-a", "default-batch") == (
        *in_budget,
        "in-budget: no class chosen; globalDefault class default-batch replaced",
    )


def test_user_class_above_the_ceiling_in_budget_gets_the_in_budget_class(hook: Webhook) -> None:
    assert admit(hook, "team-a", "high") == (
        "gpu-in-budget",
        1200,
        "PreemptLowerPriority",
        "user-class-above-ceiling: class high (100000) above the ceiling 1200, replaced",
    )


def test_user_class_at_or_below_the_ceiling_is_kept(hook: Webhook) -> None:
    assert admit(hook, "team-a", "low") == (
        "low",
        500,
        None,
        "user-class-kept: class low (500) at or below the ceiling 1200",
    )
    assert admit(hook, "generous", "high")[:2] == ("high", 100000)


def test_replace_policy_gives_a_user_class_the_in_budget_class(hook: Webhook) -> None:
    assert admit(hook, "strict", "low") == (
        "gpu-in-budget",
        1200,
        "PreemptLowerPriority",
        "user-class-replaced: class low replaced (user classes: replace)",
    )


def test_decisions_are_counted_by_rule_and_dry_run_is_not(hook: Webhook) -> None:
    before = hook.metric("webhook_priority_decisions_total", rule="user-class-kept")
    gpu_pod = pod(container("main", {"nvidia.com/gpu": 1}), priorityClassName="low", priority=500)
    hook.mutate(gpu_pod, dry_run=True)
    assert hook.metric("webhook_priority_decisions_total", rule="user-class-kept") == before
    hook.mutate(gpu_pod)
    assert hook.metric("webhook_priority_decisions_total", rule="user-class-kept") == before + 1


def test_the_view_follows_the_watch_through_an_expired_resource_version(
    hook: Webhook, cluster: KubeApiServer
) -> None:
    """An API server restart after compaction ends the watch and answers 410 to its resourceVersion:
    the webhook lists afresh and carries on watching."""
    cluster.compact()
    cluster.put(priority_class("batch-default", 10, "PreemptLowerPriority", True))
    try:
        hook.wait_until(lambda: hook.metric("webhook_priority_classes") == len(CLASSES) + 1)
        patched = hook.admit(
            pod(container("main", {"nvidia.com/gpu": 1}), priorityClassName="batch-default", priority=10)
        )
        assert patched["metadata"]["annotations"][names.ANNOTATION_PRIORITY_DECISION].startswith("in-budget:")
    finally:
        cluster.remove("scheduling.k8s.io/v1", "PriorityClass", None, "batch-default")
    hook.wait_until(lambda: hook.metric("webhook_priority_classes") == len(CLASSES))


def test_a_webhook_that_cannot_reach_the_api_keeps_deciding_and_counts_the_failures(
    tls: Tls, state: StateServer, tmp_path: Path
) -> None:
    server = KubeApiServer().start()
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", "not-a-token")
    with serve_webhook(
        tls, state, watch_priority_classes=True, kubeconfig=kubeconfig, kube_retry_max_seconds=0.1
    ) as served:
        served.wait_until(lambda: served.metric("webhook_priority_class_watch_errors_total") >= 2)
        assert served.metric("webhook_priority_classes") == -1
        # The settings' numbers, and a class of unknown value above the ceiling.
        assert admit(served, "team-a", "default-batch") == (
            "gpu-in-budget",
            1000,
            "PreemptLowerPriority",
            "user-class-above-ceiling: class default-batch (unknown value) above the ceiling 1000, replaced",
        )
    server.stop()
