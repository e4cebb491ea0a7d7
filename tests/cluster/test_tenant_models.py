"""Budgets per GPU model (issue 41) on the real API server 1.20, attacked by a member of the namespace with
only the built-in `edit` role. The namespace's H100 budget (10 GPU-minutes beside a total of 100,000) is
spent by ten minutes its sidecar reported for a pod on a Node labelled `nvidia.com/gpu.product:
NVIDIA-H100-80GB-HBM3` (in Kubernetes auth mode the timekeeper charges a pod at its node's model, as
weights are). One namespace reduces, one steers (`model_policy`).

What a tenant writes is stored and read back: a pod that selects the H100 is stored at the reduced class,
one selecting the A100 at the in-budget class, and under steering one selecting no model at the in-budget
class with a required `NotIn` that keeps it off the H100. Then each attack (pod labels, affinities that
exclude nothing or too little, the model in another spelling, `nodeName`, a DRA claim that matches every
device, a Deployment's pods, an UPDATE, a forged decision annotation) must end as no in-budget pod that
the scheduler could place on the H100 Node: checked with Kubernetes' own node affinity rule
(as `tests/webhook/test_steering.py` states it, with matchFields) on the object the API server stored.
"""

from __future__ import annotations

import base64
import copy
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import pytest
from kubernetes import client

from gpuaccounting import names
from gpuaccounting.placement import PRODUCT_LABEL
from tests.cluster.conftest import start_webhook
from tests.cluster.dra_crds import CRDS
from tests.cluster.harness import (
    Kubectl,
    KubectlError,
    Tenant,
    TimekeeperApi,
    WebhookTls,
    gpu_probe,
    placed,
    serve_crds,
    sidecar_token,
    tenant_in,
)
from tests.cluster.test_tenant_resources import DRA_EDIT_ROLE, gone
from tests.support.control_plane import ControlPlane
from tests.support.dra import DEVICE_CLASSES, NVIDIA_GPU_CLASS, claim, claim_spec, claiming_pod, request
from tests.support.pods import review
from tests.support.processes import LOCAL_HTTP, TimekeeperProcess, WebhookProcess, free_port, wait_until
from tests.support.timekeeper import report_body

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
IN_BUDGET, REDUCED = "gpu-in-budget", "gpu-over-budget"
MODELS = {H100: {"budget_gpu_minutes": 10}}  # beside a total of 100,000
CHARGED_MINUTES = 10


@dataclass(frozen=True)
class Spent:
    """A namespace whose H100 budget is exhausted, its tenant, and the H100 Node (name and labels)."""

    tenant: Tenant
    policy: str
    node: str
    labels: dict[str, str]

    @property
    def namespace(self) -> str:
        return self.tenant.namespace


@pytest.fixture(scope="module")
def h100_node(kubectl: Kubectl) -> Iterator[tuple[str, dict[str, str]]]:
    """A Node as GPU Feature Discovery labels an H100 one (no kubelet runs it)."""
    name = f"h100-{uuid.uuid4().hex[:8]}"
    labels = {PRODUCT_LABEL: H100, "kubernetes.io/hostname": name, "zone": "a"}
    kubectl.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
    yield name, labels
    kubectl.run("delete", "node", name, "--wait=false")


def charge_h100(
    api: TimekeeperApi, kubectl: Kubectl, core: client.CoreV1Api, namespace: str, node: str
) -> None:
    """Ten GPU-minutes of a pod bound to the H100 Node, as its sidecar reports them."""
    bound = placed(gpu_probe(namespace), namespace, "spender-h100")
    bound["spec"]["nodeName"] = node
    pod = kubectl.create(bound)
    metadata = pod["metadata"]
    start = datetime.now(UTC) - timedelta(minutes=CHARGED_MINUTES + 1)
    body = report_body(
        namespace=namespace,
        pod=metadata["name"],
        pod_uid=metadata["uid"],
        seq=1,
        start=start,
        minutes=CHARGED_MINUTES,
    )
    answer = LOCAL_HTTP.post(
        f"{api.url}/api/v1/reports",
        json=body,
        headers={"Authorization": f"Bearer {sidecar_token(core, pod)}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text


def decision(kubectl: Kubectl, namespace: str, spec: dict[str, Any]) -> str:
    """The priority decision the admission chain gives a GPU pod with `spec` fields now (a dry run)."""
    probe = gpu_probe(namespace)
    probe["spec"] |= spec
    stored = kubectl.create(probe, "--dry-run=server")
    return str(stored["metadata"]["annotations"][names.ANNOTATION_PRIORITY_DECISION])


def spent_namespace(
    policy: str,
    control_plane: ControlPlane,
    kubectl: Kubectl,
    core: client.CoreV1Api,
    api: TimekeeperApi,
    node: str,
    labels: dict[str, str],
    folder: Path,
) -> Iterator[Spent]:
    namespace = f"models-{policy}-{uuid.uuid4().hex[:6]}"
    kubectl.run("create", "namespace", namespace)
    wait_until(
        lambda: any(
            a.metadata.name == "default" and a.secrets
            for a in core.list_namespaced_service_account(namespace).items
        ),
        timeout=30,
        what=f"the default ServiceAccount of {namespace}",
    )
    tenant = tenant_in(control_plane, kubectl, core, namespace, folder)
    api.set_budget(namespace, 100000, models=MODELS, model_policy=policy)
    charge_h100(api, kubectl, core, namespace, node)
    wait_until(
        lambda: api.budget(namespace)["models"][H100]["state"] == "exhausted",
        timeout=30,
        what="the H100 budget exhausted",
    )
    wanted = "model-exhausted:" if policy == "reduce" else "steered:"
    wait_until(
        lambda: decision(kubectl, namespace, {}).startswith(wanted),
        timeout=30,
        what=f"the webhook to decide {namespace} by its H100 budget",
    )
    yield Spent(tenant, policy, node, labels)
    kubectl.run("delete", "namespace", namespace, "--wait=false")


@pytest.fixture(scope="module")
def reducing(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    core: client.CoreV1Api,
    api: TimekeeperApi,
    webhook: WebhookProcess,
    h100_node: tuple[str, dict[str, str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Spent]:
    yield from spent_namespace(
        "reduce", control_plane, kubectl, core, api, *h100_node, tmp_path_factory.mktemp("reduce")
    )


@pytest.fixture(scope="module")
def steering(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    core: client.CoreV1Api,
    api: TimekeeperApi,
    webhook: WebhookProcess,
    h100_node: tuple[str, dict[str, str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Spent]:
    yield from spent_namespace(
        "steer", control_plane, kubectl, core, api, *h100_node, tmp_path_factory.mktemp("steer")
    )


@pytest.fixture(params=["reduce", "steer"])
def spent(request: pytest.FixtureRequest) -> Spent:
    found: Spent = request.getfixturevalue("reducing" if request.param == "reduce" else "steering")
    return found


def gpu_pod(namespace: str, **spec: Any) -> dict[str, Any]:
    """A one-GPU pod of `namespace` with these spec fields, a fresh name."""
    body = gpu_probe(namespace)
    body["metadata"]["name"] = f"pod-{uuid.uuid4().hex[:8]}"
    body["spec"] |= spec
    return body


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }


def term(*expressions: dict[str, Any]) -> dict[str, Any]:
    return {"matchExpressions": list(expressions)}


def product(operator: str, *values: str) -> dict[str, Any]:
    found: dict[str, Any] = {"key": PRODUCT_LABEL, "operator": operator}
    return found | ({"values": list(values)} if operator in ("In", "NotIn") else {})


def _matches(requirement: dict[str, Any], labels: dict[str, str]) -> bool:
    key, operator, values = requirement["key"], requirement["operator"], requirement.get("values", [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return key in labels and labels[key].isdigit()  # Gt, Lt: none of our labels is a number; be generous


def schedulable(spec: dict[str, Any], name: str, labels: dict[str, str]) -> bool:
    """k8s.io/component-helpers' rule: nodeSelector ANDed with the required terms, ORed; a term's
    matchExpressions (labels) and matchFields (metadata.name) ANDed; an empty term matches no node."""
    if any(labels.get(key) != value for key, value in (spec.get("nodeSelector") or {}).items()):
        return False
    required_ = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required_ is None:
        return True
    fields = {"metadata.name": name}
    return any(
        (term.get("matchExpressions") or term.get("matchFields"))
        and all(_matches(e, labels) for e in term.get("matchExpressions") or [])
        and all(_matches(e, fields) for e in term.get("matchFields") or [])
        for term in required_["nodeSelectorTerms"]
    )


def can_land_on_h100(spent: Spent, stored: dict[str, Any]) -> bool:
    """Whether the scheduler could place the stored pod on the H100 Node (one naming its node skips it)."""
    spec = stored["spec"]
    if spec.get("nodeName"):
        return bool(spec["nodeName"] == spent.node)
    return schedulable(spec, spent.node, spent.labels)


def assert_no_in_budget_h100_pod(spent: Spent, stored: dict[str, Any]) -> None:
    annotations = stored["metadata"].get("annotations") or {}
    decided = annotations.get(names.ANNOTATION_PRIORITY_DECISION)
    if stored["spec"].get("priorityClassName") == REDUCED:
        assert H100 in str(decided), decided  # the decision says which model budget decided
        return
    assert not can_land_on_h100(spent, stored), (
        f"in-budget pod ({stored['spec'].get('priorityClassName')}, {decided}) can land on the H100: "
        f"{json.dumps(stored['spec'].get('affinity'))} {stored['spec'].get('nodeSelector')}"
    )


def create_or_refused(tenant: Tenant, body: dict[str, Any]) -> dict[str, Any] | None:
    """The pod as stored, or None when the API server refused it (no pod, nothing to land anywhere)."""
    try:
        return tenant.kubectl.create(body)
    except KubectlError:
        return None


# --- Must show --------------------------------------------------------------------------------------


def test_a_pod_selecting_the_h100_is_stored_at_the_reduced_class(reducing: Spent, api: TimekeeperApi) -> None:
    answer = api.budget(reducing.namespace)
    assert answer["state"] == "in_budget"  # the total
    assert answer["models"][H100]["state"] == "exhausted"

    stored = reducing.tenant.kubectl.create(gpu_pod(reducing.namespace, nodeSelector={PRODUCT_LABEL: H100}))

    assert stored["spec"]["priorityClassName"] == REDUCED
    decided = stored["metadata"]["annotations"][names.ANNOTATION_PRIORITY_DECISION]
    assert decided.startswith(f"model-exhausted: model {H100} exhausted"), decided


def test_a_pod_selecting_the_a100_keeps_the_in_budget_class(reducing: Spent) -> None:
    stored = reducing.tenant.kubectl.create(gpu_pod(reducing.namespace, nodeSelector={PRODUCT_LABEL: A100}))

    assert stored["spec"]["priorityClassName"] == IN_BUDGET
    assert stored["metadata"]["annotations"][names.ANNOTATION_PRIORITY_DECISION].startswith("in-budget:")


def test_under_steering_a_pod_selecting_no_model_is_stored_in_budget_off_the_h100(
    steering: Spent, kubectl: Kubectl
) -> None:
    created = steering.tenant.kubectl.create(gpu_pod(steering.namespace))

    stored = kubectl.json("get", "pod", created["metadata"]["name"], "-n", steering.namespace)
    assert stored["spec"]["priorityClassName"] == IN_BUDGET
    assert stored["spec"]["affinity"] == required(term(product("NotIn", H100)))
    decided = stored["metadata"]["annotations"][names.ANNOTATION_PRIORITY_DECISION]
    assert decided.startswith(f"steered: steered off exhausted model {H100}"), decided
    assert not can_land_on_h100(steering, stored)
    assert schedulable(stored["spec"], "a100", {PRODUCT_LABEL: A100})  # narrowed, not shut


# --- Attacks ----------------------------------------------------------------------------------------

ATTACKS: dict[str, dict[str, Any]] = {
    "labels-claim-a100": {"nodeSelector": {PRODUCT_LABEL: H100}},  # labels added below
    "labels-claim-a100-no-selector": {},
    "notin-nothing": {"affinity": required(term(product("NotIn")))},
    "notin-another-model": {"affinity": required(term(product("NotIn", A100)))},
    "exists": {"affinity": required(term(product("Exists")))},
    "second-term-without-product": {
        "affinity": required(
            term(product("In", A100)), term({"key": "zone", "operator": "In", "values": ["a"]})
        )
    },
    "preferred-only": {
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "preference": term(product("In", A100))}
                ]
            }
        }
    },
    "notin-lower-case": {"affinity": required(term(product("NotIn", H100.lower())))},
    "notin-nvml-spelling": {"affinity": required(term(product("NotIn", H100.replace("-", " "))))},
    "in-both-spellings": {"affinity": required(term(product("In", H100.lower(), H100)))},
    "selector-lower-case-and-in-h100": {
        "nodeSelector": {PRODUCT_LABEL: H100},
        "affinity": required(term(product("In", H100.lower(), A100))),
    },
    "node-name": {},  # the H100 Node's name, set below
    "node-name-and-a100-selector": {"nodeSelector": {PRODUCT_LABEL: A100}},  # and nodeName
    "empty-term-beside-open-term": {
        "affinity": required({"matchExpressions": []}, term({"key": "zone", "operator": "Exists"}))
    },
    "match-fields-h100": {
        "affinity": required({"matchFields": [{"key": "metadata.name", "operator": "In", "values": []}]})
    },  # values set below
}


def attack_pod(spent: Spent, case: str) -> dict[str, Any]:
    body = gpu_pod(spent.namespace, **copy.deepcopy(ATTACKS[case]))
    if case.startswith("labels-claim"):
        body["metadata"]["labels"] = {PRODUCT_LABEL: A100, "gpu-timekeeper.io/model": A100}
    if case.startswith("node-name"):
        body["spec"]["nodeName"] = spent.node
    if case == "match-fields-h100":
        fields = body["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        fields["nodeSelectorTerms"][0]["matchFields"][0]["values"] = [spent.node]
    return body


def test_the_h100_node_is_what_the_checks_are_against(steering: Spent) -> None:
    """The rule the attacks are judged by places a plain pod, and an H100-selecting one, on the Node."""
    assert can_land_on_h100(steering, gpu_pod(steering.namespace))
    assert can_land_on_h100(steering, gpu_pod(steering.namespace, nodeSelector={PRODUCT_LABEL: H100}))


@pytest.mark.parametrize("case", sorted(ATTACKS))
def test_no_spec_gets_an_in_budget_pod_onto_the_h100(spent: Spent, case: str) -> None:
    stored = create_or_refused(spent.tenant, attack_pod(spent, case))

    if stored is not None:
        assert_no_in_budget_h100_pod(spent, stored)


@pytest.mark.parametrize("forged", ["steered", "in-budget", "exempt", "workload-class-kept"])
def test_a_forged_decision_annotation_changes_nothing(spent: Spent, forged: str) -> None:
    body = gpu_pod(spent.namespace, nodeSelector={PRODUCT_LABEL: H100}, priorityClassName=IN_BUDGET)
    body["metadata"]["annotations"] = {
        names.ANNOTATION_PRIORITY_DECISION: f"{forged}: steered off exhausted model {H100}; no class chosen",
        names.ANNOTATION_BUDGET_STATE: "in_budget",
        names.ANNOTATION_WORKLOAD: "Job/train",
    }

    stored = create_or_refused(spent.tenant, body)

    if stored is not None:
        assert stored["spec"]["priorityClassName"] == REDUCED
        assert_no_in_budget_h100_pod(spent, stored)


def deployment(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    template_spec = gpu_probe(namespace)["spec"] | spec
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": template_spec},
        },
    }


@pytest.mark.parametrize("template", ["no-model", "h100", "notin-another-model"], ids=lambda case: str(case))
def test_a_deployments_pods_are_decided_as_the_tenants_own(
    spent: Spent, kubectl: Kubectl, template: str
) -> None:
    spec = {
        "no-model": {},
        "h100": {"nodeSelector": {PRODUCT_LABEL: H100}},
        "notin-another-model": ATTACKS["notin-another-model"],
    }[template]
    name = f"deploy-{template}"
    spent.tenant.kubectl.create(deployment(spent.namespace, name, copy.deepcopy(spec)))

    def made() -> list[dict[str, Any]]:
        found = kubectl.json("get", "pods", "-n", spent.namespace, "-l", f"app={name}")["items"]
        return list(found) if len(found) == 2 else []

    wait_until(lambda: bool(made()), timeout=60, what=f"the Deployment {name}'s pods")
    for stored in made():
        assert stored["metadata"]["annotations"][names.ANNOTATION_CREATED_BY].startswith("system:")
        assert_no_in_budget_h100_pod(spent, stored)


def test_an_update_may_not_drop_the_steering_affinity(steering: Spent, kubectl: Kubectl) -> None:
    created = steering.tenant.kubectl.create(gpu_pod(steering.namespace))
    assert created["spec"]["priorityClassName"] == IN_BUDGET and created["spec"].get("affinity")

    for change in ("drop", "notin-nothing-else"):
        updated = copy.deepcopy(created)
        if change == "drop":
            del updated["spec"]["affinity"]
        else:
            updated["spec"]["affinity"] = required(term(product("NotIn", A100)))
        with pytest.raises(KubectlError) as refused:
            steering.tenant.kubectl.run("replace", "-f", "-", stdin=json.dumps(updated))
        assert "Forbidden: pod updates may not change fields" in refused.value.stderr

    stored = kubectl.json("get", "pod", created["metadata"]["name"], "-n", steering.namespace)
    assert stored["spec"]["affinity"] == created["spec"]["affinity"]
    assert_no_in_budget_h100_pod(steering, stored)


def statefulset(namespace: str, name: str, replicas: int, spec: dict[str, Any]) -> dict[str, Any]:
    """A StatefulSet whose pods the controller replaces only when they are deleted (OnDelete)."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": gpu_probe(namespace)["spec"] | spec},
        },
    }


def test_a_statefulset_cannot_move_its_in_budget_pods_onto_the_h100(spent: Spent, kubectl: Kubectl) -> None:
    """Its pods select the A100 and are admitted in budget; then the tenant points the template at the
    H100 and deletes a pod: the controller's replacement is the same workload's (StatefulSet/swap), but it
    can land on the exhausted model, so it may not keep the A100 pods' in-budget class."""
    namespace, name = spent.namespace, "swap"
    spent.tenant.kubectl.create(statefulset(namespace, name, 2, {"nodeSelector": {PRODUCT_LABEL: A100}}))

    def pods() -> dict[str, dict[str, Any]]:
        found = kubectl.json("get", "pods", "-n", namespace, "-l", f"app={name}")["items"]
        return {pod["metadata"]["name"]: pod for pod in found if not pod["metadata"].get("deletionTimestamp")}

    wait_until(lambda: len(pods()) == 2, timeout=60, what="the StatefulSet's two pods")
    first = pods()
    assert {pod["spec"]["priorityClassName"] for pod in first.values()} == {IN_BUDGET}

    patch = {"spec": {"template": {"spec": {"nodeSelector": {PRODUCT_LABEL: H100}}}}}
    spent.tenant.kubectl.run(
        "patch", "statefulset", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch)
    )
    old_uid = first[f"{name}-1"]["metadata"]["uid"]
    spent.tenant.kubectl.run("delete", "pod", f"{name}-1", "-n", namespace)

    def replaced() -> dict[str, Any] | None:
        pod = pods().get(f"{name}-1")
        return pod if pod is not None and pod["metadata"]["uid"] != old_uid else None

    wait_until(lambda: replaced() is not None, timeout=60, what="the replacement from the new template")
    stored = replaced()
    assert stored is not None and stored["spec"]["nodeSelector"] == {PRODUCT_LABEL: H100}
    assert_no_in_budget_h100_pod(spent, stored)


# --- DRA: 1.20 has no resource.k8s.io and drops a pod's resourceClaims, so the claims are stored through
# CRDs written from the upstream types (tests/cluster/dra_crds.py) and the pod's review is POSTed to a webhook
# that watches them, as the API server of 1.34 would send it (as tests/cluster/test_dra.py does).


@pytest.fixture(scope="module")
def dra_webhook(
    kubectl: Kubectl,
    control_plane: ControlPlane,
    core: client.CoreV1Api,
    webhook_tls: WebhookTls,
    timekeeper: TimekeeperProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WebhookProcess]:
    """resource.k8s.io/v1 served (once test_dra.py's copy is gone), NVIDIA's DeviceClasses, `edit` granted
    claims (as test_tenant_resources.py grants them), and a webhook that finds the group by discovery."""
    references = [f"crd/{definition['metadata']['name']}" for definition in CRDS]
    wait_until(lambda: gone(kubectl, references), timeout=60, what="an earlier module's DRA CRDs to go")
    serve_crds(kubectl, tuple(CRDS))
    for device_class in DEVICE_CLASSES:
        kubectl.create(device_class)
    kubectl.create(DRA_EDIT_ROLE)

    def aggregated() -> bool:
        edit = kubectl.json("get", "clusterrole", "edit")
        return any("resourceclaims" in rule.get("resources", []) for rule in edit.get("rules") or [])

    wait_until(aggregated, timeout=30, what="`edit` to aggregate the DRA rules")
    process = start_webhook(
        control_plane,
        core,
        webhook_tls,
        timekeeper,
        tmp_path_factory.mktemp("models-dra-webhook"),
        free_port(),
        WEBHOOK_DRA_DISCOVERY_INTERVAL_SECONDS="0.5",
    )
    yield process
    process.stop()
    role: dict[str, Any] = DRA_EDIT_ROLE
    kubectl.run("delete", "clusterrole", role["metadata"]["name"], "--wait=true")
    kubectl.run("delete", *references, "--wait=true")


def dra_admit(webhook: WebhookProcess, pod: dict[str, Any], username: str) -> dict[str, Any]:
    """The pod as /mutate patches it."""
    response = webhook.client.post(f"{webhook.url}/mutate", json=review(pod, username=username))
    assert response.status_code == 200, response.text
    answer = response.json()["response"]
    assert answer["allowed"], answer
    patch = orjson.loads(base64.b64decode(answer["patch"]))
    patched: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(pod), patch)
    return patched


EVERY_DEVICE = {
    "class-only": None,
    "driver-only": "device.driver == 'gpu.nvidia.com'",
    "true": "true",
    "a100-or-true": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-80GB' || true",
    "a100-other-domain": "device.attributes['evil.example'].productName == 'NVIDIA A100-SXM4-80GB'",
    "a100-negated": "!(device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3')",
}


@pytest.mark.parametrize("case", sorted(EVERY_DEVICE))
def test_a_dra_claim_matching_every_device_is_no_way_onto_the_h100(
    spent: Spent, kubectl: Kubectl, dra_webhook: WebhookProcess, case: str
) -> None:
    expression = EVERY_DEVICE[case]
    selectors = [] if expression is None else [{"cel": {"expression": expression}}]
    fields = {"selectors": selectors} if selectors else {}
    name = f"every-{case}"
    spec = claim_spec(request("gpu", NVIDIA_GPU_CLASS, **fields))
    spent.tenant.kubectl.create(claim(name, spent.namespace, spec))  # the tenant's own claim
    pod = claiming_pod(spent.namespace, claims={"gpu": name})

    patched = dra_admit(dra_webhook, pod, spent.tenant.username)

    assert_no_in_budget_h100_pod(spent, patched)
    if spent.policy == "reduce":
        assert patched["spec"]["priorityClassName"] == REDUCED


def test_a_dra_claim_pinned_to_the_a100_keeps_the_in_budget_class(
    reducing: Spent, kubectl: Kubectl, dra_webhook: WebhookProcess
) -> None:
    """The control: the webhook does read a claim that pins a model (NVML's spelling, as the driver's)."""
    pinned = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-80GB'"
    spec = claim_spec(request("gpu", NVIDIA_GPU_CLASS, selectors=[{"cel": {"expression": pinned}}]))
    kubectl.create(claim("a100", reducing.namespace, spec))

    patched = dra_admit(dra_webhook, claiming_pod(reducing.namespace, claims={"gpu": "a100"}), "alice")

    assert patched["spec"]["priorityClassName"] == IN_BUDGET


def test_steering_adds_its_requirement_once_per_term(steering: Spent) -> None:
    """The API server calls /mutate again after another webhook (reinvocationPolicy IfNeeded): an empty
    term (matching no node, read as any model) beside an open one had the requirement added twice."""
    body = attack_pod(steering, "empty-term-beside-open-term")

    stored = steering.tenant.kubectl.create(body)

    terms = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {},
        term({"key": "zone", "operator": "Exists"}, product("NotIn", H100)),
    ]
    assert stored["spec"]["priorityClassName"] == IN_BUDGET


def test_a_steered_pod_cannot_be_bound_to_the_h100_by_its_tenant(steering: Spent, kubectl: Kubectl) -> None:
    """A Binding skips the scheduler (and so the steering affinity): `edit` may not create one."""
    created = steering.tenant.kubectl.create(gpu_pod(steering.namespace))
    name = created["metadata"]["name"]
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": steering.namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": steering.node},
    }

    with pytest.raises(KubectlError) as refused:
        steering.tenant.kubectl.create(binding)

    assert "forbidden" in refused.value.stderr.lower()
    assert not kubectl.json("get", "pod", name, "-n", steering.namespace)["spec"].get("nodeName")
