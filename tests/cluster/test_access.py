"""Who may call the timekeeper, decided by the real API server: TokenReview for a pod-bound projected token,
SubjectAccessReview against the ClusterRoles deployment/ ships (aggregated into `view` by the real
controller manager)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
from kubernetes import client

from tests.cluster.harness import (
    Kubectl,
    TimekeeperApi,
    gpu_probe,
    member_token,
    service_account_token,
    sidecar_token,
)
from tests.support.processes import LOCAL_HTTP, wait_until
from tests.support.timekeeper import report_body


def gpu_pod(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    """A one-GPU pod created through the webhook (it is what gives the pod its token volume)."""
    body = copy.deepcopy(gpu_probe(namespace))
    body["metadata"]["name"] = name
    return kubectl.create(body)


def report(
    api: TimekeeperApi, token: str, pod: dict[str, Any], seq: int = 1, **overrides: Any
) -> httpx.Response:
    """One minute of `pod`'s use, as its sidecar reports it (fields in `overrides` replaced)."""
    metadata = pod["metadata"]
    identity = {"namespace": metadata["namespace"], "pod": metadata["name"], "pod_uid": metadata["uid"]}
    start = datetime.now(UTC) - timedelta(minutes=2)
    body = report_body(**(identity | overrides), seq=seq, start=start, minutes=1)
    return LOCAL_HTTP.post(
        f"{api.url}/api/v1/reports", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )


def charged(api: TimekeeperApi, namespace: str) -> Decimal:
    """All the namespace's charged use, whatever period it fell in: the budget's `used` counts only the
    current month's, and the reports above cover the minute before last, in the month before when a test
    runs in the first two minutes of one."""
    usage = api.ok("GET", f"/namespaces/{namespace}/usage?since=2000-01-01T00:00:00Z")
    return Decimal(str(usage["total_gpu_minutes"]))


def test_a_pod_bound_token_reports_for_its_pod_only(
    kubectl: Kubectl, core: client.CoreV1Api, api: TimekeeperApi, namespace: str
) -> None:
    """The token the kubelet would project into the sidecar (TokenRequest: audience gpu-timekeeper, bound
    to the pod) authenticates through a real TokenReview, whose pod-name/pod-uid extras tie it to its pod."""
    trainer = gpu_pod(kubectl, namespace, "trainer")
    other = gpu_pod(kubectl, namespace, "other")
    token = sidecar_token(core, trainer)

    accepted = report(api, token, trainer)
    for_another = report(api, token, other)
    wrong_uid = report(api, token, trainer, seq=2, pod_uid=other["metadata"]["uid"])
    elsewhere = report(api, token, trainer, seq=3, namespace="kube-system")

    assert accepted.status_code == 200, accepted.text
    assert Decimal(str(accepted.json()["gpu_minutes"])) == 1
    assert (for_another.status_code, wrong_uid.status_code, elsewhere.status_code) == (403, 403, 403)
    assert charged(api, namespace) == 1


def test_unknown_tokens_for_another_audience_or_a_deleted_pod_cannot_report(
    kubectl: Kubectl, core: client.CoreV1Api, api: TimekeeperApi, namespace: str
) -> None:
    trainer = gpu_pod(kubectl, namespace, "trainer")
    api_audience = service_account_token(core, namespace, "default", pod=trainer)
    vault = service_account_token(core, namespace, "default", audiences=("vault",), pod=trainer)
    unbound = service_account_token(core, namespace, "default", audiences=("gpu-timekeeper",))
    bound = sidecar_token(core, trainer)

    assert report(api, "not-a-token", trainer).status_code == 401
    assert report(api, vault, trainer).status_code == 401  # pod-bound, but for another service
    assert report(api, api_audience, trainer).status_code == 403  # a user of the API server, not a pod
    assert report(api, unbound, trainer).status_code == 403  # no pod in the token
    kubectl.run("delete", "pod", "trainer", "-n", namespace, "--grace-period=0", "--force")
    wait_until(
        lambda: report(api, bound, trainer).status_code == 401,
        timeout=20,
        what="the deleted pod's token refused",
    )
    assert charged(api, namespace) == 0


def view_aggregates_budgets(kubectl: Kubectl) -> bool:
    rules = kubectl.json("get", "clusterrole", "view").get("rules") or []
    return any("gpubudgets" in rule.get("resources", []) for rule in rules)


def test_a_namespace_member_reads_their_own_budget_and_not_anothers(
    kubectl: Kubectl, core: client.CoreV1Api, api: TimekeeperApi, namespace: str
) -> None:
    """`gpu-timekeeper-viewer` is aggregated into the built-in `view`: a RoleBinding to `view` in a
    namespace lets its holder read that namespace's budget and usage (SubjectAccessReview), nothing else."""
    wait_until(lambda: view_aggregates_budgets(kubectl), timeout=30, what="view to aggregate gpubudgets")
    token = member_token(kubectl, core, namespace, "view")
    api.set_budget(namespace, 100)

    own = api.request("GET", f"/namespaces/{namespace}/budget", token=token)
    usage = api.request("GET", f"/namespaces/{namespace}/usage", token=token)
    another = api.request("GET", "/namespaces/kube-system/budget", token=token)
    listed = api.request("GET", "/namespaces", token=token)
    raise_own = api.request(
        "PUT", f"/namespaces/{namespace}/budget", token=token, body={"budget_gpu_minutes": 10**6}
    )

    assert own.status_code == 200 and Decimal(str(own.json()["budget_gpu_minutes"])) == 100
    assert usage.status_code == 200
    assert listed.status_code == 200 and [entry["namespace"] for entry in listed.json()] == [namespace]
    assert (another.status_code, raise_own.status_code) == (403, 403)


def listed(api: TimekeeperApi, token: str) -> list[str]:
    response = api.request("GET", "/namespaces", token=token)
    assert response.status_code == 200, response.text
    return [entry["namespace"] for entry in response.json()]


def test_the_namespace_list_shows_exactly_what_each_caller_may_read(
    kubectl: Kubectl, core: client.CoreV1Api, api: TimekeeperApi, namespace: str
) -> None:
    """A member of two namespaces (`view` bound in each) lists exactly those two, though the timekeeper
    knows more; a cluster-wide viewer (`gpu-timekeeper-viewer` in a ClusterRoleBinding) lists every known
    namespace; an account bound to nothing lists none, with 200 — all by the real SubjectAccessReviews."""
    wait_until(lambda: view_aggregates_budgets(kubectl), timeout=30, what="view to aggregate gpubudgets")
    second, unbound = f"{namespace}-2", f"{namespace}-3"
    for extra in (second, unbound):
        kubectl.run("create", "namespace", extra)
    try:
        for known in (namespace, second, unbound):
            api.set_budget(known, 100)
        member = member_token(kubectl, core, namespace, "view")
        kubectl.run(
            "create", "rolebinding", "member", "--clusterrole=view",
            f"--serviceaccount={namespace}:member", "-n", second,
        )  # fmt: skip
        kubectl.run("create", "serviceaccount", "viewer", "-n", namespace)
        kubectl.run(
            "create", "clusterrolebinding", f"{namespace}-viewer", "--clusterrole=gpu-timekeeper-viewer",
            f"--serviceaccount={namespace}:viewer",
        )  # fmt: skip
        kubectl.run("create", "serviceaccount", "nobody", "-n", namespace)

        everything = set(listed(api, api.admin_token))
        assert sorted(listed(api, member)) == sorted([namespace, second])
        viewer = set(listed(api, service_account_token(core, namespace, "viewer")))
        assert {namespace, second, unbound} <= everything <= viewer  # (known namespaces only get added)
        assert listed(api, service_account_token(core, namespace, "nobody")) == []
    finally:
        kubectl.run("delete", "clusterrolebinding", f"{namespace}-viewer", "--ignore-not-found")
        for extra in (second, unbound):
            kubectl.run("delete", "namespace", extra, "--wait=false")


def test_a_namespace_admin_cannot_raise_their_own_budget(
    kubectl: Kubectl, core: client.CoreV1Api, api: TimekeeperApi, namespace: str
) -> None:
    """`gpu-timekeeper-admin` is deliberately not aggregated into `admin`; bound in one namespace it
    delegates that namespace's budget, not the cluster's defaults."""
    wait_until(lambda: view_aggregates_budgets(kubectl), timeout=30, what="admin to aggregate gpubudgets")
    namespace_admin = member_token(kubectl, core, namespace, "admin")
    raise_own = api.request(
        "PUT", f"/namespaces/{namespace}/budget", token=namespace_admin, body={"budget_gpu_minutes": 10**6}
    )
    read_own = api.request("GET", f"/namespaces/{namespace}/budget", token=namespace_admin)
    assert (raise_own.status_code, read_own.status_code) == (403, 200)

    budget_admin = member_token(kubectl, core, namespace, "gpu-timekeeper-admin", account="budget-admin")
    body = {"budget_gpu_minutes": 500, "period": "monthly"}
    raised = api.request("PUT", f"/namespaces/{namespace}/budget", token=budget_admin, body=body)
    defaults = api.request("PUT", "/defaults", token=budget_admin, body=body)

    assert (raised.status_code, defaults.status_code) == (200, 403)
    assert Decimal(str(api.budget(namespace)["budget_gpu_minutes"])) == 500
