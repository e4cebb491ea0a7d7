"""The GPU supply on a node (issue 36): a tenant with only `edit` in its namespace asks the node, not the
device plugin, for a GPU, on the real API server with the shipped install.

Each route of docs/security.md's threat model ("The GPU supply on a node") is tried here: the toolkit's
variables, its device-list mount, CDI and NRI annotations, the NVIDIA runtime class, hostPath device nodes
and privilege, in a bare pod, in the pods of a Deployment, a Job and a StatefulSet, added by an UPDATE or
in an ephemeral container. Each is refused, the reason naming the route and the node setting behind it.
The node agent alone keeps its variable, by its namespace and ServiceAccount; ordinary GPU pods of every
sharing system, toolkit variables that select no device beside them, are admitted as before.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gpuaccounting import names
from gpuaccounting.supply import NODE_SETTINGS, SupplyRoute
from tests.cluster.harness import (
    Install,
    Kubectl,
    KubectlError,
    Tenant,
    TimekeeperApi,
    admits,
    placed,
    wait_for_admission_state,
)
from tests.cluster.test_tenant import sent_to_webhook
from tests.support.pods import GPU_PODS, container, pod, review
from tests.support.processes import WebhookProcess, wait_until
from tests.support.supply import ROUTE_PODS, env, issue_pod, route_pod, with_env

REFUSED = 'admission webhook "validate.gpu-timekeeper.io" denied the request'
NODE_AGENT_NAMESPACE = "gpu-timekeeper-node"
NODE_AGENT_ACCOUNT = "gpu-timekeeper-nodeagent"


@pytest.fixture(scope="module", autouse=True)
def nvidia_runtime_class(kubectl: Kubectl) -> None:
    """The RuntimeClass the GPU Operator creates: the API server's RuntimeClass admission refuses a pod
    naming one that does not exist, before our webhook could judge it."""
    runtime_class = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia"},
        "handler": "nvidia",
    }
    kubectl.run("apply", "-f", "-", stdin=json.dumps(runtime_class))


def assert_refused_for(refusal: str, route: SupplyRoute) -> None:
    assert REFUSED in refusal
    assert f"route {route}" in refusal
    assert NODE_SETTINGS[route] in refusal


def test_the_issue_pod_is_refused_in_an_exhausted_namespace(
    tenant: Tenant, kubectl: Kubectl, api: TimekeeperApi
) -> None:
    """Issue 36's pod was stored at gpu-in-budget with no sidecar and never charged a minute."""
    api.set_budget(tenant.namespace, 0)
    wait_for_admission_state(kubectl, tenant.namespace, "exhausted")

    refusal = tenant.kubectl.refusal(issue_pod(tenant.namespace))

    assert_refused_for(refusal, SupplyRoute.VISIBLE_DEVICES_ENV)
    assert 'container "main": env NVIDIA_VISIBLE_DEVICES=all' in refusal


@pytest.mark.parametrize("case", sorted(set(ROUTE_PODS) - {"env-all"}))
def test_each_route_in_a_bare_pod_is_refused(tenant: Tenant, case: str) -> None:
    refusal = tenant.kubectl.refusal(route_pod(case, tenant.namespace))

    assert_refused_for(refusal, ROUTE_PODS[case][1])


def controller(kind: str, namespace: str) -> dict[str, Any]:
    """A Deployment, Job or StatefulSet whose pod template is issue 36's pod."""
    template_spec = copy.deepcopy(issue_pod(namespace)["spec"])
    labels = {"app": "env-all"}
    spec: dict[str, Any] = {"template": {"metadata": {"labels": labels}, "spec": template_spec}}
    if kind == "Job":
        template_spec["restartPolicy"] = "Never"
        spec["backoffLimit"] = 0
        api_version = "batch/v1"
    else:
        spec["selector"] = {"matchLabels": labels}
        spec["replicas"] = 1
        api_version = "apps/v1"
    if kind == "StatefulSet":
        spec["serviceName"] = "env-all"
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "env-all", "namespace": namespace},
        "spec": spec,
    }


def failed_creations(kubectl: Kubectl, namespace: str) -> list[str]:
    events = kubectl.json("get", "events", "-n", namespace, "--field-selector", "reason=FailedCreate")
    return [str(event.get("message", "")) for event in events["items"]]


@pytest.mark.parametrize("kind", ["Deployment", "Job", "StatefulSet"])
def test_a_controllers_pods_using_a_route_are_refused_as_a_bare_pod_is(
    tenant: Tenant, kubectl: Kubectl, kind: str
) -> None:
    """The controller is stored (its template is no pod); each pod it makes is judged as the tenant's own."""
    tenant.kubectl.create(controller(kind, tenant.namespace))

    wait_until(
        lambda: any("route visible-devices-env" in m for m in failed_creations(kubectl, tenant.namespace)),
        timeout=60,
        what=f"the {kind}'s controller to be refused a pod",
    )

    assert kubectl.json("get", "pods", "-n", tenant.namespace, "-l", "app=env-all")["items"] == []


def test_an_update_may_not_add_a_cdi_annotation(tenant: Tenant, install: Install) -> None:
    """The kubelet builds the pod's sandbox when it starts it: an annotation added while the pod waits
    for a node reaches the runtime. A 1.30+ API server sends the UPDATE (the shipped CEL, evaluated)."""
    stored = tenant.kubectl.create(pod(container("main"), name="plain", namespace=tenant.namespace))
    updated = copy.deepcopy(stored)
    updated["metadata"]["annotations"] = {"cdi.k8s.io/gpus": "nvidia.com/gpu=all"}
    request = review(updated, operation="UPDATE", old=stored, username=tenant.username)

    with pytest.raises(KubectlError) as refused:
        tenant.kubectl.run("replace", "-f", "-", stdin=json.dumps(updated))

    assert sent_to_webhook(install.configuration("ValidatingWebhookConfiguration"), request["request"])
    assert_refused_for(refused.value.stderr, SupplyRoute.CDI_ANNOTATION)


@pytest.mark.parametrize("gpu", [False, True], ids=["plain-pod", "gpu-pod"])
def test_an_ephemeral_container_may_not_add_a_route(
    tenant: Tenant, install: Install, webhook: WebhookProcess, gpu: bool
) -> None:
    """`kubectl debug` with the variable: an ephemeral container has no device of its own, so the toolkit
    would hand it every GPU of the node. 1.20 does not serve pods/ephemeralcontainers (alpha, off): the
    review the API server would send is POSTed to /validate, and the shipped CEL says it would be sent."""
    asks = {"nvidia.com/gpu": 1} if gpu else None
    stored = tenant.kubectl.create(pod(container("main", asks), name="debugged", namespace=tenant.namespace))
    debugged = copy.deepcopy(stored)
    debugger = with_env({"name": "debugger", "image": "busybox:1.36"}, env("NVIDIA_VISIBLE_DEVICES", "all"))
    debugged["spec"]["ephemeralContainers"] = [debugger]
    request = review(
        debugged, operation="UPDATE", old=stored, subresource="ephemeralcontainers", username=tenant.username
    )

    answer = webhook.client.post(f"{webhook.url}/validate", json=request).json()["response"]

    assert sent_to_webhook(install.configuration("ValidatingWebhookConfiguration"), request["request"])
    assert answer["allowed"] is False
    assert 'container "debugger": env NVIDIA_VISIBLE_DEVICES=all' in answer["status"]["message"]
    assert "route visible-devices-env" in answer["status"]["message"]


@pytest.fixture
def node_agent_namespace(kubectl: Kubectl) -> Iterator[str]:
    """The node agent's namespace and ServiceAccount, as deployment/nodeagent makes them."""
    kubectl.run("create", "namespace", NODE_AGENT_NAMESPACE)
    kubectl.run("create", "serviceaccount", NODE_AGENT_ACCOUNT, "-n", NODE_AGENT_NAMESPACE)
    wait_until(
        lambda: bool(kubectl.json("get", "serviceaccount", "default", "-n", NODE_AGENT_NAMESPACE)),
        timeout=30,
        what="the namespace's default ServiceAccount",
    )
    yield NODE_AGENT_NAMESPACE
    kubectl.run("delete", "namespace", NODE_AGENT_NAMESPACE, "--wait=false")


def agent_pod(namespace: str, account: str) -> dict[str, Any]:
    body = route_pod("env-all", namespace, "agent")
    body["spec"]["serviceAccountName"] = account
    del body["spec"]["priorityClassName"]
    return body


def test_the_node_agent_alone_keeps_its_variable(
    tenant: Tenant, kubectl: Kubectl, node_agent_namespace: str
) -> None:
    """Exempt by its namespace and its ServiceAccount together: neither another pod of its namespace nor
    the tenant's pod under a ServiceAccount of the same name (the tenant may make one) gets through."""
    tenant.kubectl.run("create", "serviceaccount", NODE_AGENT_ACCOUNT, "-n", tenant.namespace)

    assert admits(kubectl, agent_pod(node_agent_namespace, NODE_AGENT_ACCOUNT))
    assert not admits(kubectl, agent_pod(node_agent_namespace, "default"))
    refusal = tenant.kubectl.refusal(agent_pod(tenant.namespace, NODE_AGENT_ACCOUNT))
    assert_refused_for(refusal, SupplyRoute.VISIBLE_DEVICES_ENV)


@pytest.mark.parametrize("system", sorted(GPU_PODS))
def test_ordinary_gpu_pods_are_admitted_as_before(tenant: Tenant, system: str) -> None:
    """Every sharing system, under the NVIDIA runtime class, with NVIDIA_DRIVER_CAPABILITIES beside the
    GPU: stored with our sidecar and its share, as before issue 36."""
    original, share = GPU_PODS[system]
    body = placed(original, tenant.namespace, "ordinary")
    body["spec"]["runtimeClassName"] = "nvidia"
    with_env(body["spec"]["containers"][0], env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"))

    stored = tenant.kubectl.create(body)

    assert stored["metadata"]["annotations"][names.ANNOTATION_GPU_SHARE] == share
    assert names.SIDECAR_CONTAINER_NAME in [c["name"] for c in stored["spec"]["containers"]]
