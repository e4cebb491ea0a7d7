"""The priority policy on a real API server (issue 12's must-show): the Priority plugin fills in the
`globalDefault` class or the user's own before our webhook runs, and an exhausted namespace's GPU pod
still gets the reduced class unless its class is exempt there. The webhook watches the PriorityClasses as its
own ServiceAccount (the RBAC deployment/ ships), and its view follows create, update and delete."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from typing import Any

import jsonpatch
import orjson
import pytest

from gpuaccounting import names
from tests.cluster.harness import Kubectl, TimekeeperApi, gpu_probe, wait_for_admission_state
from tests.support.pods import review
from tests.support.processes import WebhookProcess, wait_until

OVER_BUDGET = ("gpu-over-budget", 100, "Never")
# Classes the control plane creates itself; the default priority policy exempts them where listed.
SYSTEM_NODE_CRITICAL = ("system-node-critical", 2000001000)


def priority_class(name: str, value: int, global_default: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "globalDefault": global_default,
        "preemptionPolicy": "PreemptLowerPriority",
    }


def known_classes(webhook: WebhookProcess) -> float:
    for line in webhook.client.get(f"{webhook.url}/metrics").text.splitlines():
        if line.startswith("webhook_priority_classes "):
            return float(line.split()[1])
    raise AssertionError("webhook_priority_classes is not exported")


def count_in_cluster(kubectl: Kubectl) -> int:
    return len(kubectl.json("get", "priorityclasses")["items"])


def wait_for_the_webhooks_view(kubectl: Kubectl, webhook: WebhookProcess) -> None:
    expected = count_in_cluster(kubectl)
    wait_until(
        lambda: known_classes(webhook) == expected, timeout=30, what="the webhook's PriorityClass view"
    )


def decision(stored: dict[str, Any]) -> str:
    return str(stored["metadata"]["annotations"][names.ANNOTATION_PRIORITY_DECISION])


def priority_of(stored: dict[str, Any]) -> tuple[str, int, str | None]:
    spec = stored["spec"]
    return spec["priorityClassName"], spec["priority"], spec.get("preemptionPolicy")


def probe(namespace: str, priority_class_name: str | None = None) -> dict[str, Any]:
    pod = gpu_probe(namespace)
    if priority_class_name is not None:
        pod["spec"]["priorityClassName"] = priority_class_name
    return pod


def admitted(kubectl: Kubectl, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the whole admission chain leaves it (server-side dry run: nothing stored). The Priority
    plugin learns a new class through its own informer, so a just-created class is retried briefly."""
    found: dict[str, Any] = {}

    def created() -> bool:
        try:
            found.update(kubectl.create(pod, "--dry-run=server"))
        except AssertionError as error:
            if "no PriorityClass with name" in str(error):
                return False
            raise
        return True

    wait_until(created, timeout=15, what="the Priority plugin to know the class")
    return found


@pytest.fixture
def cluster_default(kubectl: Kubectl, webhook: WebhookProcess) -> Iterator[str]:
    """A `globalDefault` PriorityClass above our in-budget class (as issue 12 measured: 5000), deleted
    afterwards so the other tests see a cluster without one."""
    name = f"default-batch-{uuid.uuid4().hex[:6]}"
    kubectl.create(priority_class(name, 5000, global_default=True))
    try:
        wait_for_the_webhooks_view(kubectl, webhook)
        yield name
    finally:
        kubectl.run("delete", "priorityclass", name)
        wait_for_the_webhooks_view(kubectl, webhook)


@pytest.fixture
def exhausted(kubectl: Kubectl, api: TimekeeperApi, namespace: str) -> str:
    api.set_budget(namespace, 0)
    wait_for_admission_state(kubectl, namespace, "exhausted")
    return namespace


def test_a_global_default_class_in_an_exhausted_namespace_gets_the_reduced_class(
    kubectl: Kubectl, exhausted: str, cluster_default: str
) -> None:
    stored = admitted(kubectl, probe(exhausted))  # names no class: the Priority plugin fills in the default

    assert priority_of(stored) == OVER_BUDGET
    assert (
        decision(stored) == f"exhausted: namespace exhausted; globalDefault class {cluster_default} replaced"
    )


def test_a_user_class_in_an_exhausted_namespace_gets_the_reduced_class(
    kubectl: Kubectl, webhook: WebhookProcess, exhausted: str
) -> None:
    kubectl.create(priority_class(f"high-{exhausted}", 100000))
    try:
        wait_for_the_webhooks_view(kubectl, webhook)
        stored = admitted(kubectl, probe(exhausted, f"high-{exhausted}"))
    finally:
        kubectl.run("delete", "priorityclass", f"high-{exhausted}")

    assert priority_of(stored) == OVER_BUDGET
    assert decision(stored) == f"exhausted: namespace exhausted; class high-{exhausted} replaced"


def test_an_exempt_class_is_kept_only_in_a_namespace_an_admin_lists(
    kubectl: Kubectl, api: TimekeeperApi, exhausted: str
) -> None:
    """The system classes are exempt in kube-system and the product's namespace by default; in any other
    exhausted namespace they get the reduced class (tests/cluster/test_tenant.py replays it as a tenant).
    On 1.20 the webhooks see kube-system: its `kubernetes.io/metadata.name` label does not exist yet."""
    api.set_budget("kube-system", 0)
    try:
        wait_for_admission_state(kubectl, "kube-system", "exhausted")
        kept = admitted(kubectl, probe("kube-system", SYSTEM_NODE_CRITICAL[0]))
    finally:
        api.set_budget("kube-system", None)
    governed = admitted(kubectl, probe(exhausted, SYSTEM_NODE_CRITICAL[0]))

    assert priority_of(kept)[:2] == SYSTEM_NODE_CRITICAL
    assert decision(kept) == f"exempt: class {SYSTEM_NODE_CRITICAL[0]} is exempt"
    assert priority_of(governed) == OVER_BUDGET
    assert decision(governed) == f"exhausted: namespace exhausted; class {SYSTEM_NODE_CRITICAL[0]} replaced"


def test_the_webhooks_view_follows_create_update_and_delete(
    kubectl: Kubectl, api: TimekeeperApi, webhook: WebhookProcess, namespace: str
) -> None:
    api.set_budget(namespace, 1000)
    wait_for_admission_state(kubectl, namespace, "in_budget")
    name = f"batch-{uuid.uuid4().hex[:6]}"

    # Created as the globalDefault: a pod naming no class arrives with it and gets the in-budget class.
    kubectl.create(priority_class(name, 5000, global_default=True))
    try:
        wait_for_the_webhooks_view(kubectl, webhook)
        stored = admitted(kubectl, probe(namespace))
        assert stored["spec"]["priorityClassName"] == "gpu-in-budget"
        assert decision(stored) == f"in-budget: no class chosen; globalDefault class {name} replaced"

        # Updated to an ordinary class: naming it is a user's choice, above the ceiling (1000).
        kubectl.run("patch", "priorityclass", name, "--type=merge", "-p", '{"globalDefault": false}')

        def user_class() -> bool:
            return decision(admitted(kubectl, probe(namespace, name))).startswith("user-class-above-ceiling")

        wait_until(user_class, timeout=30, what="the webhook to see the update")
        stored = admitted(kubectl, probe(namespace, name))
        assert (
            decision(stored)
            == f"user-class-above-ceiling: class {name} (5000) above the ceiling 1000, replaced"
        )
        assert stored["spec"]["priorityClassName"] == "gpu-in-budget"
    finally:
        # Deleted: the API server now refuses pods naming it, so ask the webhook directly what it knows.
        kubectl.run("delete", "priorityclass", name)
    wait_for_the_webhooks_view(kubectl, webhook)
    pod = probe(namespace, name)
    answer = webhook.client.post(f"{webhook.url}/mutate", json=review(pod)).json()
    patched = jsonpatch.apply_patch(pod, orjson.loads(base64.b64decode(answer["response"]["patch"])))
    assert (
        decision(patched)
        == f"user-class-above-ceiling: class {name} (unknown value) above the ceiling 1000, replaced"
    )
