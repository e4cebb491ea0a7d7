"""GPUBudget objects on a real API server (deployment/'s CRDs applied), synced by the timekeeper running as
its own ServiceAccount with TIMEKEEPER_GITOPS (a pass every second): kubectl changes become the budget,
charges become the status, the REST API defers to the object, and invalid specs never apply."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.harness import Kubectl, KubectlError, TimekeeperApi, gpu_probe, placed, sidecar_token
from tests.support.processes import LOCAL_HTTP, wait_until
from tests.support.timekeeper import report_body
from tests.timekeeper.test_gitops_objects import doc_objects

API_VERSION = "gpu-timekeeper.io/v1alpha1"
SYNC_SECONDS = 30  # a pass a second; generous for a loaded machine


def gpubudget(namespace: str, name: str = "budget", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "GPUBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def apply(kubectl: Kubectl, obj: dict[str, Any], *options: str) -> None:
    kubectl.run("apply", *options, "-f", "-", stdin=json.dumps(obj))


def status_of(kubectl: Kubectl, namespace: str, name: str = "budget") -> dict[str, Any]:
    status: dict[str, Any] = kubectl.json("get", "gpubudget", name, "-n", namespace).get("status", {})
    return status


def conditions(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status.get("conditions", [])}


def wait_for_status(
    kubectl: Kubectl, namespace: str, what: str, name: str = "budget", **expected: Any
) -> dict[str, Any]:
    """Until the object's status has these fields (`conditions` compared as {type: status} ⊇ given)."""
    seen: dict[str, Any] = {}

    def matches() -> bool:
        seen.clear()
        seen.update(status_of(kubectl, namespace, name))
        wanted_conditions = expected.get("conditions", {})
        return conditions(seen).items() >= wanted_conditions.items() and all(
            seen.get(k) == v for k, v in expected.items() if k != "conditions"
        )

    wait_until(matches, timeout=SYNC_SECONDS, what=what)
    return seen


def audit(api: TimekeeperApi, namespace: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = api.ok("GET", f"/audit?namespace={namespace}")
    return entries


def test_a_gpubudget_created_updated_and_deleted_with_kubectl_is_the_namespaces_budget(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str
) -> None:
    apply(kubectl, gpubudget(namespace, budgetGPUMinutes=600, period="weekly"))
    wait_until(
        lambda: api.budget(namespace)["budget_gpu_minutes"] == 600, timeout=SYNC_SECONDS, what="the budget"
    )
    budget = api.budget(namespace)
    assert (budget["source"], budget["period"]["kind"], budget["warn_at_fraction"]) == (
        "namespace",
        "weekly",
        0.8,
    )
    [put] = audit(api, namespace)
    assert (put["actor"], put["action"]) == (f"gitops:GPUBudget {namespace}/budget", "budget.put")

    status = wait_for_status(
        kubectl, namespace, "the status", observedGeneration=1, conditions={"Ready": "True"}
    )
    assert (status["budgetGPUMinutes"], status["usedGPUMinutes"], status["remainingGPUMinutes"]) == (
        "600",
        "0",
        "600",
    )
    assert (status["state"], status["period"]["kind"]) == ("in_budget", "weekly")
    assert conditions(status) == {"Ready": "True", "Warning": "False", "Exhausted": "False"}
    # `kubectl get gpubudgets -A` answers "how much have we left?" (the CRD's printer columns).
    table = kubectl.run("get", "gpubudgets", "-A").splitlines()
    assert table[0].split()[:8] == [
        "NAMESPACE",
        "NAME",
        "BUDGET",
        "USED",
        "REMAINING",
        "STATE",
        "PERIOD",
        "READY",
    ]
    [row] = [line.split() for line in table[1:] if line.split()[0] == namespace]
    assert row[1:8] == ["budget", "600", "0", "600", "in_budget", "weekly", "True"]

    apply(kubectl, gpubudget(namespace, budgetGPUMinutes=1200, period="weekly"))
    wait_until(
        lambda: api.budget(namespace)["budget_gpu_minutes"] == 1200, timeout=SYNC_SECONDS, what="the update"
    )
    wait_for_status(kubectl, namespace, "the updated status", observedGeneration=2, budgetGPUMinutes="1200")
    assert (
        len(audit(api, namespace)) == 2
    )  # one change, one entry: passes that find nothing new write nothing

    kubectl.run("delete", "gpubudget", "budget", "-n", namespace)
    wait_until(lambda: api.budget(namespace)["source"] == "default", timeout=SYNC_SECONDS, what="the default")
    deleted = audit(api, namespace)[0]
    assert (deleted["actor"], deleted["action"]) == (
        f"gitops:GPUBudget {namespace}/budget (deleted)",
        "budget.delete",
    )
    api.set_budget(namespace, 5)  # the namespace is the REST API's again


def charge(api: TimekeeperApi, token: str, pod: dict[str, Any], seq: int) -> None:
    """One GPU-minute of `pod`'s, as its sidecar reports it (each seq its own minute)."""
    metadata = pod["metadata"]
    start = datetime.now(UTC) - timedelta(minutes=10 - seq)
    body = report_body(
        namespace=metadata["namespace"], pod=metadata["name"], pod_uid=metadata["uid"], seq=seq, start=start
    )
    answer = LOCAL_HTTP.post(
        f"{api.url}/api/v1/reports", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert answer.status_code == 200 and answer.json()["gpu_minutes"] == 1, answer.text


def test_the_status_and_its_conditions_follow_the_charges(
    kubectl: Kubectl, core: client.CoreV1Api, api: TimekeeperApi, namespace: str
) -> None:
    # No period: the charges cover minutes just past, which fall in the month before when the test runs
    # in the first minutes of one, and a monthly budget would never see them.
    apply(kubectl, gpubudget(namespace, budgetGPUMinutes=2, warnAtFraction=0.5, period="none"))
    wait_for_status(kubectl, namespace, "the first status", conditions={"Ready": "True"}, state="in_budget")
    pod = kubectl.create(placed(gpu_probe(namespace), namespace, "trainer"))
    token = sidecar_token(core, pod)

    charge(api, token, pod, 1)
    status = wait_for_status(kubectl, namespace, "warning", state="warning", usedGPUMinutes="1")
    assert status["remainingGPUMinutes"] == "1"
    # The budget API's forecast: the minute charged over its window, and when the last one will go.
    forecast = api.budget(namespace)["forecast"]
    assert status["forecast"]["windowMinutes"] == forecast["window_minutes"]
    assert float(status["forecast"]["burnRateGPUMinutesPerHour"]) > 0
    assert conditions(status) == {"Ready": "True", "Warning": "True", "Exhausted": "False"}

    charge(api, token, pod, 2)
    status = wait_for_status(kubectl, namespace, "exhausted", state="exhausted", usedGPUMinutes="2")
    assert (status["remainingGPUMinutes"], status["priorityClass"]) == ("0", "gpu-over-budget")
    assert conditions(status) == {"Ready": "True", "Warning": "False", "Exhausted": "True"}
    exhausted = next(c for c in status["conditions"] if c["type"] == "Exhausted")
    assert exhausted["reason"] == "BudgetExhausted" and "2 of 2 GPU-minutes used" in exhausted["message"]


def test_rest_writes_to_a_namespace_a_gpubudget_governs_are_refused(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str
) -> None:
    api.set_budget(namespace, 50)  # the REST API's, until an object takes the namespace over
    apply(kubectl, gpubudget(namespace, budgetGPUMinutes=100))
    wait_until(
        lambda: api.budget(namespace)["budget_gpu_minutes"] == 100, timeout=SYNC_SECONDS, what="the object"
    )

    put = api.request("PUT", f"/namespaces/{namespace}/budget", body={"budget_gpu_minutes": 1})
    delete = api.request("DELETE", f"/namespaces/{namespace}/budget")
    for answer in (put, delete):
        assert answer.status_code == 409, answer.text
        assert f"managed by GPUBudget {namespace}/budget" in answer.json()["detail"]
    assert api.budget(namespace)["budget_gpu_minutes"] == 100
    # Grants are one-off top-ups, not policy: still the REST API's.
    api.ok("POST", f"/namespaces/{namespace}/grants", body={"gpu_minutes": 5, "reason": "deadline"})


def test_the_default_object_governs_put_defaults_and_only_one_named_default_counts(
    kubectl: Kubectl, api: TimekeeperApi
) -> None:
    """Stated as the default already is (unlimited, monthly), so the cluster's other tests see no change."""
    current = api.ok("GET", "/defaults")
    default = {
        "apiVersion": API_VERSION,
        "kind": "GPUBudgetDefault",
        "metadata": {"name": "default"},
        "spec": {},
    }
    refusal = ""
    try:
        apply(kubectl, default | {"metadata": {"name": "other"}}, "--validate=false")
    except KubectlError as error:
        refusal = error.stderr
    assert "metadata.name" in refusal and "default" in refusal  # the schema allows the one name
    apply(kubectl, default)
    try:
        wait_until(
            lambda: api.request("PUT", "/defaults", body={"budget_gpu_minutes": None}).status_code == 409,
            timeout=SYNC_SECONDS,
            what="PUT /defaults refused",
        )
        answer = api.request("PUT", "/defaults", body={"budget_gpu_minutes": None})
        assert "managed by GPUBudgetDefault default" in answer.json()["detail"]
        ready = kubectl.json("get", "gpubudgetdefault", "default")
        wait_until(
            lambda: (
                conditions(kubectl.json("get", "gpubudgetdefault", "default").get("status", {})).get("Ready")
                == "True"
            ),
            timeout=SYNC_SECONDS,
            what="the default's Ready condition",
        )
        assert ready["spec"] == {"period": "monthly", "warnAtFraction": 0.8}  # the schema's defaults
        assert api.ok("GET", "/defaults") == current  # the same default: nothing applied, nothing audited
    finally:
        kubectl.run("delete", "gpubudgetdefault", "default")
    wait_until(
        lambda: api.request("PUT", "/defaults", body={"budget_gpu_minutes": None}).status_code == 200,
        timeout=SYNC_SECONDS,
        what="PUT /defaults the REST API's again",
    )


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ({"budgetGPUMinutes": -5}, "spec.budgetGPUMinutes"),
        ({"budgetGPUMinutes": 10, "period": "yearly"}, "spec.period"),
        ({"warnAtFraction": 1.5}, "spec.warnAtFraction"),
        ({"priorityPolicy": {"exemptClasses": ["Not_A_Name"], "userClasses": "replace"}}, "exemptClasses"),
        ({"models": {"NVIDIA-H100-80GB-HBM3": {"budgetGPUMinutes": -1}}}, "budgetGPUMinutes"),
        ({"models": {"NVIDIA-H100-80GB-HBM3": {}}}, "budgetGPUMinutes"),
        ({"modelPolicy": "evict"}, "spec.modelPolicy"),
    ],
)
def test_an_invalid_spec_is_refused_by_the_schema(
    kubectl: Kubectl, namespace: str, spec: dict[str, Any], complaint: str
) -> None:
    """Refused by the API server itself (`--validate=false`: not kubectl's client-side check)."""
    with pytest.raises(KubectlError) as refused:
        apply(kubectl, gpubudget(namespace, **spec), "--validate=false")
    assert complaint in refused.value.stderr
    assert kubectl.json("get", "gpubudgets", "-n", namespace)["items"] == []


def test_a_spec_the_schema_cannot_judge_is_reported_and_never_applied(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str
) -> None:
    apply(kubectl, gpubudget(namespace, budgetGPUMinutes=40, warnAtFraction=0.12345))
    status = wait_for_status(kubectl, namespace, "InvalidSpec", conditions={"Ready": "False"})
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec" and "spec.warnAtFraction" in ready["message"]
    assert api.budget(namespace)["source"] == "default"  # nothing of it applied
    # ... yet the object governs the namespace: a REST write would be overwritten by the fixed spec.
    assert (
        api.request("PUT", f"/namespaces/{namespace}/budget", body={"budget_gpu_minutes": 1}).status_code
        == 409
    )

    apply(kubectl, gpubudget(namespace, "second", budgetGPUMinutes=7))  # newer: never governs
    apply(kubectl, gpubudget(namespace, budgetGPUMinutes=40, warnAtFraction=0.125))
    wait_until(
        lambda: api.budget(namespace)["budget_gpu_minutes"] == 40, timeout=SYNC_SECONDS, what="the fix"
    )
    wait_for_status(kubectl, namespace, "Ready", conditions={"Ready": "True"}, observedGeneration=2)
    second = wait_for_status(kubectl, namespace, "the conflict", "second", conditions={"Ready": "False"})
    assert next(c for c in second["conditions"] if c["type"] == "Ready")["reason"] == "Conflict"
    assert api.budget(namespace)["budget_gpu_minutes"] == 40


def test_the_objects_docs_gitops_shows_pass_the_api_servers_schema(kubectl: Kubectl, namespace: str) -> None:
    """Server-side dry runs: nothing is stored, every rule of the CRD's schema applied."""
    for obj in doc_objects():
        if obj["kind"] == "GPUBudget":
            obj["metadata"]["namespace"] = namespace
        kubectl.create(obj, "--dry-run=server")


def test_kubectl_get_shows_the_exhausted_models_column(kubectl: Kubectl, namespace: str) -> None:
    """The CRD's printer column for status.exhaustedModels (the sync writes it, docs/gitops.md)."""
    models = {"NVIDIA-H100-80GB-HBM3": {"budgetGPUMinutes": 10}}
    apply(kubectl, gpubudget(namespace, budgetGPUMinutes=100000, models=models, modelPolicy="steer"))
    header = kubectl.run("get", "gpubudgets", "-n", namespace).splitlines()[0]
    assert "EXHAUSTED MODELS" in header
    stored = kubectl.json("get", "gpubudget", "budget", "-n", namespace)["spec"]
    assert stored["models"] == models and stored["modelPolicy"] == "steer"  # kept, not pruned
