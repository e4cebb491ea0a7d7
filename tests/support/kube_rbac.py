"""RBAC objects for the stand-in API server: the rules the timekeeper ships, and a cluster's usual roles.

`timekeeper_rules()` is exactly what the timekeeper's own ServiceAccount needs (docs/kubernetes.md lists the
same rules for deployment/); the tests run the KubeClient with that identity, so a missing rule fails them.
"""

from __future__ import annotations

from typing import Any

from tests.support.kube_apiserver import KubeApiServer

RBAC = "rbac.authorization.k8s.io/v1"
TIMEKEEPER_NAMESPACE = "gpu-timekeeper"
TIMEKEEPER_SERVICE_ACCOUNT = "gpu-timekeeper"


def timekeeper_rules() -> list[dict[str, Any]]:
    return [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["resourcequotas"],
            "verbs": ["get", "list", "create", "update", "delete"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]


def _cluster_role(
    name: str, rules: list[dict[str, Any]], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": RBAC,
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": labels or {}},
        "rules": rules,
    }


def _binding(kind: str, name: str, role: str, subject: dict[str, Any], namespace: str | None = None) -> dict:
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": RBAC,
        "kind": kind,
        "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [subject],
    }


def install_cluster_roles(server: KubeApiServer) -> None:
    """The built-in aggregated `view` role, and the roles deployment/ ships for the timekeeper."""
    budgets = {"apiGroups": ["gpu-timekeeper.io"], "resources": ["gpubudgets"]}
    server.put(
        {
            "apiVersion": RBAC,
            "kind": "ClusterRole",
            "metadata": {"name": "view"},
            "aggregationRule": {
                "clusterRoleSelectors": [
                    {"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}
                ]
            },
            "rules": [],
        }
    )
    server.put(
        _cluster_role(
            "system:aggregate-to-view",
            [{"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": ["get", "list", "watch"]}],
            {"rbac.authorization.k8s.io/aggregate-to-view": "true"},
        )
    )
    server.put(
        _cluster_role(
            "gpu-timekeeper-viewer",
            [{**budgets, "verbs": ["get", "list"]}],
            {"rbac.authorization.k8s.io/aggregate-to-view": "true"},
        )
    )
    server.put(_cluster_role("gpu-timekeeper-admin", [{**budgets, "verbs": ["get", "list", "update"]}]))
    server.put(_cluster_role("gpu-timekeeper", timekeeper_rules()))
    server.put(
        _binding(
            "ClusterRoleBinding",
            "gpu-timekeeper",
            "gpu-timekeeper",
            {"kind": "ServiceAccount", "name": TIMEKEEPER_SERVICE_ACCOUNT, "namespace": TIMEKEEPER_NAMESPACE},
        )
    )


def bind_namespace_viewer(server: KubeApiServer, namespace: str, user: str) -> None:
    """Make `user` a member of `namespace` the usual way: the `view` ClusterRole bound in the namespace."""
    subject = {"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}
    server.put(_binding("RoleBinding", f"{user}-view", "view", subject, namespace))


def bind_cluster_role(server: KubeApiServer, role: str, user: str, namespace: str | None = None) -> None:
    """Grant a ClusterRole to a user cluster-wide, or (with `namespace`) in one namespace only."""
    subject = {"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}
    kind = "RoleBinding" if namespace else "ClusterRoleBinding"
    server.put(_binding(kind, f"{user}-{role}", role, subject, namespace))
