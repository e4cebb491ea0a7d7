"""The RBAC deployment/ ships, judged by the real API server's authorizer (SubjectAccessReview): it grants
the timekeeper every rule docs/kubernetes.md lists, and the webhook what it reads and nothing more; the
API roles work for groups, as platform admins are usually bound."""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.cluster.harness import INSTALL_NAMESPACE, Kubectl, TimekeeperApi, service_account_token
from tests.support.kube_rbac import timekeeper_rules

pytestmark = pytest.mark.usefixtures("install")  # deployment/ applied


def allowed(
    kube: client.ApiClient,
    account: str,
    verb: str,
    group: str,
    resource: str,
    namespace: str | None,
    name: str | None = None,
) -> bool:
    """What the API server answers for deployment/'s ServiceAccount `account` (with the groups every
    ServiceAccount token carries), about the object `name` where a rule names its objects."""
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{INSTALL_NAMESPACE}:{account}",
            groups=[
                "system:serviceaccounts",
                f"system:serviceaccounts:{INSTALL_NAMESPACE}",
                "system:authenticated",
            ],
            resource_attributes=client.V1ResourceAttributes(
                verb=verb,
                group=group,
                resource=resource.split("/")[0],
                subresource=_subresource(resource),
                namespace=namespace,
                name=name,
            ),
        )
    )
    return bool(client.AuthorizationV1Api(kube).create_subject_access_review(review).status.allowed)


def _subresource(resource: str) -> str | None:
    return resource.split("/", 1)[1] if "/" in resource else None


def test_deployment_grants_the_timekeeper_every_rule_it_needs(kube: client.ApiClient) -> None:
    missing = [
        (verb, group, resource, name)
        for rule in timekeeper_rules()
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames", [None])
        if not allowed(kube, "gpu-timekeeper", verb, group, resource, "team-a", name)
    ]
    assert missing == []
    # A rule that names its objects grants those only: kube-system, the cluster's identity, and no other.
    assert not allowed(kube, "gpu-timekeeper", "get", "", "namespaces", None, "team-a")


def test_the_webhook_may_read_every_namespaces_budget_and_nothing_more(kube: client.ApiClient) -> None:
    """GET /admission-state is a cluster-wide read: `list gpubudgets` at cluster scope."""
    budgets = ("gpu-timekeeper.io", "gpubudgets")

    assert allowed(kube, "gpu-timekeeper-webhook", "list", *budgets, None)
    assert not allowed(kube, "gpu-timekeeper-webhook", "update", *budgets, None)
    assert not allowed(kube, "gpu-timekeeper-webhook", "update", *budgets, "team-a")
    assert not allowed(kube, "gpu-timekeeper-webhook", "list", "", "secrets", None)


def test_platform_admins_bound_as_a_group_administer_everywhere(
    kubectl: Kubectl, core: client.CoreV1Api, api: TimekeeperApi, namespace: str
) -> None:
    """`gpu-timekeeper-admin` bound cluster-wide to a group (here every ServiceAccount of one namespace):
    its members change any namespace's budget and read the audit log, which names them."""
    group = f"system:serviceaccounts:{namespace}"
    binding = f"{namespace}-platform-admins"
    kubectl.run(
        "create", "clusterrolebinding", binding, "--clusterrole=gpu-timekeeper-admin", f"--group={group}"
    )
    try:
        kubectl.run("create", "serviceaccount", "carol", "-n", namespace)
        carol = service_account_token(core, namespace, "carol")
        outsider = service_account_token(core, namespace="default", name="default")

        changed = api.request(
            "PUT",
            "/namespaces/kube-public/budget",
            token=carol,
            body={"budget_gpu_minutes": 7, "period": "daily"},
        )
        audit = api.request("GET", "/audit", token=carol)
        refused = api.request("GET", "/audit", token=outsider)
    finally:
        kubectl.run("delete", "clusterrolebinding", binding)

    assert changed.status_code == 200, changed.text
    assert audit.status_code == 200 and refused.status_code == 403
    actors = {(entry["actor"], entry["namespace"]) for entry in audit.json()}
    assert (f"system:serviceaccount:{namespace}:carol", "kube-public") in actors


def test_the_webhook_may_read_priority_classes_and_pods_and_change_nothing(kube: client.ApiClient) -> None:
    """The PriorityClass watch: get, list and watch at cluster scope; the workload pod watch: list and
    watch pods; no write, no other resource."""
    for verb in ("get", "list", "watch"):
        assert allowed(kube, "gpu-timekeeper-webhook", verb, "scheduling.k8s.io", "priorityclasses", None)
    for verb in ("create", "update", "patch", "delete"):
        assert not allowed(kube, "gpu-timekeeper-webhook", verb, "scheduling.k8s.io", "priorityclasses", None)
    for verb in ("list", "watch"):
        assert allowed(kube, "gpu-timekeeper-webhook", verb, "", "pods", None)
    for verb in ("get", "create", "update", "patch", "delete"):
        assert not allowed(kube, "gpu-timekeeper-webhook", verb, "", "pods", None)
    assert not allowed(kube, "gpu-timekeeper-webhook", "get", "", "secrets", INSTALL_NAMESPACE)
