"""RBAC objects for the stand-in API server: the rules the timekeeper ships, and a cluster's usual roles.

`timekeeper_rules()` is exactly what the timekeeper's own ServiceAccount needs (docs/kubernetes.md lists the
same rules); the tests run the KubeClient with that identity, so a missing rule fails them, and
tests/cluster/test_rbac.py checks on a real API server that deployment/ grants them. The viewer and admin
roles are deployment/'s.
"""

from __future__ import annotations

from typing import Any

import yaml

from tests.support.kube_apiserver import KubeApiServer
from tests.support.postgres import REPO_ROOT

RBAC = "rbac.authorization.k8s.io/v1"
TIMEKEEPER_NAMESPACE = "gpu-timekeeper"
TIMEKEEPER_SERVICE_ACCOUNT = "gpu-timekeeper"
RBAC_DIR = REPO_ROOT / "deployment" / "base" / "rbac"


def timekeeper_rules() -> list[dict[str, Any]]:
    return [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list"]},
        # a fleet's hub: each cluster's identity (timekeeper/auth/kubernetes.py, ClusterIdentities)
        {"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]},  # a downgrade past the PDB patience
        {
            "apiGroups": [""],
            "resources": ["resourcequotas"],
            "verbs": ["get", "list", "create", "update", "delete"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims", "resourceslices"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["gpu-timekeeper.io"],
            "resources": ["gpubudgets", "gpubudgetdefaults"],
            "verbs": ["list", "watch"],
        },
        {
            "apiGroups": ["gpu-timekeeper.io"],
            "resources": ["gpubudgets/status", "gpubudgetdefaults/status"],
            "verbs": ["update"],
        },
        # running_pod_action `kueue` (timekeeper/reconcile/kueue.py)
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list", "watch", "patch"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloadpriorityclasses"], "verbs": ["get"]},
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


def deployment_rbac() -> list[dict[str, Any]]:
    """The RBAC objects deployment/ ships (ClusterRoles and bindings for the timekeeper and its API)."""
    objects: list[dict[str, Any]] = []
    for path in sorted(RBAC_DIR.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            objects.extend(o for o in yaml.safe_load_all(path.read_text()) if o)
    for obj in objects:
        if obj["kind"] in ("ServiceAccount", "RoleBinding", "Role"):
            obj["metadata"].setdefault("namespace", TIMEKEEPER_NAMESPACE)
    return objects


def install_cluster_roles(server: KubeApiServer) -> None:
    """A cluster's built-in roles the timekeeper relies on (the aggregated `view`, auth-delegator), the
    API roles deployment/ ships, and the timekeeper's own role reduced to exactly `timekeeper_rules()`."""
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
    for obj in deployment_rbac():
        if obj["kind"] == "ClusterRole" and obj["metadata"]["name"].startswith("gpu-timekeeper-"):
            server.put(obj)
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


def bind_cluster_wide(server: KubeApiServer, user: str, role: str) -> None:
    """Give `user` a ClusterRole everywhere (a ClusterRoleBinding), e.g. `gpu-timekeeper-viewer`."""
    subject = {"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}
    server.put(_binding("ClusterRoleBinding", f"{user}-{role}", role, subject))
