"""The RBAC deployment/ ships, evaluated by the stand-in's RBAC: it grants the timekeeper what it needs,
and the API roles mean what docs/kubernetes.md says."""

from __future__ import annotations

import pytest

from tests.support.kube_apiserver import KubeApiServer
from tests.support.kube_rbac import (
    TIMEKEEPER_NAMESPACE,
    TIMEKEEPER_SERVICE_ACCOUNT,
    deployment_rbac,
    timekeeper_rules,
)

TIMEKEEPER_USER = f"system:serviceaccount:{TIMEKEEPER_NAMESPACE}:{TIMEKEEPER_SERVICE_ACCOUNT}"
AUTH_DELEGATOR = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": "system:auth-delegator"},
    "rules": [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    ],
}


@pytest.fixture
def shipped() -> KubeApiServer:
    """A server holding only what a cluster has built in and what deployment/ ships (not started)."""
    server = KubeApiServer()
    server.put(AUTH_DELEGATOR)
    for obj in deployment_rbac():
        if obj["kind"] != "ServiceAccount":
            server.put(obj)
    return server


def test_deployment_grants_the_timekeeper_every_rule_it_needs(shipped: KubeApiServer):
    groups = (
        "system:serviceaccounts",
        f"system:serviceaccounts:{TIMEKEEPER_NAMESPACE}",
        "system:authenticated",
    )
    missing = [
        (verb, group, resource)
        for rule in timekeeper_rules()
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        if not shipped.rbac_allows(TIMEKEEPER_USER, groups, verb, group, resource, "team-a")
    ]
    assert missing == []


def test_the_webhook_may_read_every_namespaces_budget_and_nothing_more(shipped: KubeApiServer):
    """GET /admission-state is a cluster-wide read: `list gpubudgets` at cluster scope."""
    webhook = f"system:serviceaccount:{TIMEKEEPER_NAMESPACE}:gpu-timekeeper-webhook"
    groups = ("system:serviceaccounts", "system:authenticated")

    assert shipped.rbac_allows(webhook, groups, "list", "gpu-timekeeper.io", "gpubudgets", None)
    assert not shipped.rbac_allows(webhook, groups, "update", "gpu-timekeeper.io", "gpubudgets", None)
    assert not shipped.rbac_allows(webhook, groups, "update", "gpu-timekeeper.io", "gpubudgets", "team-a")


def test_the_webhook_may_read_priority_classes_and_change_nothing(shipped: KubeApiServer):
    """The PriorityClass watch: get, list and watch at cluster scope; no write, no other resource."""
    webhook = f"system:serviceaccount:{TIMEKEEPER_NAMESPACE}:gpu-timekeeper-webhook"
    groups = ("system:serviceaccounts", "system:authenticated")
    for verb in ("get", "list", "watch"):
        assert shipped.rbac_allows(webhook, groups, verb, "scheduling.k8s.io", "priorityclasses", None)
    for verb in ("create", "update", "patch", "delete"):
        assert not shipped.rbac_allows(webhook, groups, verb, "scheduling.k8s.io", "priorityclasses", None)
    assert not shipped.rbac_allows(webhook, groups, "list", "", "pods", None)
    assert not shipped.rbac_allows(webhook, groups, "get", "", "secrets", TIMEKEEPER_NAMESPACE)
