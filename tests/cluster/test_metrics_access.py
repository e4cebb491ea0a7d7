"""The budgets on the timekeeper's /metrics are private in the shipped install (issue #25): the scrape is
refused without a token and to a namespace's member, and answered to the credential components/prometheus
ships for Prometheus (a ServiceAccount bound cluster-wide to gpu-timekeeper-viewer, its token written into
a Secret by the real controller manager), checked by the real TokenReview and SubjectAccessReview."""

from __future__ import annotations

import base64

import httpx
from kubernetes import client

from tests.cluster.harness import INSTALL_NAMESPACE, Kubectl, TimekeeperApi, service_account_token
from tests.support.processes import LOCAL_HTTP, REPO_ROOT, TimekeeperProcess, wait_until

METRICS_READER = REPO_ROOT / "deployment" / "components" / "prometheus" / "metrics-reader.yaml"


def scrape(timekeeper: TimekeeperProcess, token: str | None) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return LOCAL_HTTP.get(f"{timekeeper.url}/metrics", headers=headers, timeout=10)


def shipped_token(core: client.CoreV1Api) -> str:
    """The token the API server writes into the metrics-reader Secret, once it has."""
    found: list[str] = []

    def written() -> bool:
        data = core.read_namespaced_secret("gpu-timekeeper-metrics-token", INSTALL_NAMESPACE).data or {}
        if "token" in data:
            found.append(base64.b64decode(data["token"]).decode())
        return bool(found)

    wait_until(written, timeout=30, what="the metrics token written into its Secret")
    return found[0]


def test_budgets_on_metrics_need_the_token_prometheus_is_given(
    kubectl: Kubectl,
    core: client.CoreV1Api,
    api: TimekeeperApi,
    timekeeper: TimekeeperProcess,
    namespace: str,
) -> None:
    kubectl.run("apply", "-n", INSTALL_NAMESPACE, "-f", str(METRICS_READER))
    api.set_budget(namespace, 100)
    kubectl.run("create", "serviceaccount", "member", "-n", namespace)
    kubectl.run(
        "create", "rolebinding", "member", "--clusterrole=view", f"--serviceaccount={namespace}:member",
        "-n", namespace,
    )  # fmt: skip

    prometheus = scrape(timekeeper, shipped_token(core))
    member = scrape(timekeeper, service_account_token(core, namespace, "member"))
    anonymous = scrape(timekeeper, None)

    assert prometheus.status_code == 200, prometheus.text
    assert f'timekeeper_namespace_budget_gpu_minutes{{namespace="{namespace}"}} 100.0' in prometheus.text
    assert (anonymous.status_code, member.status_code) == (401, 403)
