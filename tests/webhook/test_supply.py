"""`/validate` and the GPU supply beside the device plugin (issue 36): each route a pod's spec can open to a
GPU is refused, the reason naming the route and the node setting behind it, unless the hardware file
allows the route or exempts the namespace and ServiceAccount; an UPDATE or an ephemeral container may not
add one; ordinary GPU pods, toolkit variables that select no device beside them, are admitted as before."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuaccounting.supply import DEFAULT_SUPPLY, NODE_SETTINGS, SupplyRoute, route_uses
from tests.support.admission_state_server import StateServer
from tests.support.pods import GPU_PODS, container, pod
from tests.support.supply import (
    EVASION_PODS,
    ROUTE_PODS,
    env,
    issue_pod,
    ordinary_gpu_pod,
    route_pod,
    with_env,
)
from tests.webhook.conftest import Tls, Webhook, serve_webhook

NODE_AGENT = ("gpu-timekeeper-node", "gpu-timekeeper-nodeagent")


@pytest.mark.parametrize("case", sorted(ROUTE_PODS))
def test_each_route_is_refused_naming_the_route_and_the_node_setting(webhook: Webhook, case: str) -> None:
    body, route = ROUTE_PODS[case]

    answer = webhook.validate(webhook.admit(copy.deepcopy(body)))

    assert not answer.allowed
    assert f"route {route}" in answer.message
    assert NODE_SETTINGS[route] in answer.message
    assert "rule gpu-supply" in answer.message


def test_the_issue_pod_is_refused_whatever_its_class(webhook: Webhook) -> None:
    """Issue 36's pod, at gpu-in-budget, no sidecar: refused at /validate, /mutate leaving it alone."""
    assert webhook.mutate(issue_pod()).patch == []

    answer = webhook.validate(issue_pod())

    assert not answer.allowed
    assert 'container "main": env NVIDIA_VISIBLE_DEVICES=all' in answer.message


@pytest.mark.parametrize("value", ["void", "none", "", " VOID "])
def test_a_variable_that_selects_no_device_is_admitted(webhook: Webhook, value: str) -> None:
    quiet = pod(with_env(container("main"), env("NVIDIA_VISIBLE_DEVICES", value)))
    assert webhook.validate(quiet).allowed


@pytest.mark.parametrize("system", sorted(GPU_PODS))
def test_ordinary_gpu_pods_of_every_system_are_admitted_as_before(webhook: Webhook, system: str) -> None:
    """The NVIDIA runtime class and toolkit variables that select no device, beside a GPU asked the
    ordinary way, in every sharing system."""
    body = copy.deepcopy(GPU_PODS[system][0])
    body["spec"]["runtimeClassName"] = "nvidia"
    with_env(body["spec"]["containers"][0], env("NVIDIA_DRIVER_CAPABILITIES", "all"))

    stored = webhook.admit(body)

    assert webhook.validate(stored).allowed


def test_a_gpu_pod_with_driver_capabilities_is_admitted(webhook: Webhook) -> None:
    assert webhook.validate(webhook.admit(ordinary_gpu_pod())).allowed


def test_the_node_agent_is_exempt_by_its_namespace_and_service_account_only(webhook: Webhook) -> None:
    namespace, account = NODE_AGENT
    agent = route_pod("env-all", namespace, "agent")
    agent["spec"]["serviceAccountName"] = account
    other = copy.deepcopy(agent)
    other["spec"]["serviceAccountName"] = "default"
    borrowed = route_pod("env-all", "team-a", "borrowed")
    borrowed["spec"]["serviceAccountName"] = account

    assert webhook.validate(agent).allowed
    assert "route visible-devices-env" in webhook.validate(other).message
    assert "route visible-devices-env" in webhook.validate(borrowed).message


def test_an_update_may_not_add_a_cdi_annotation(webhook: Webhook) -> None:
    """The kubelet builds the sandbox from the pod when it starts it: an annotation added while the pod
    waits for a node would reach the runtime."""
    old = pod(container("main"))
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"cdi.k8s.io/gpus": "nvidia.com/gpu=all"}

    answer = webhook.validate(new, operation="UPDATE", old=old)

    assert not answer.allowed and "route cdi-annotation" in answer.message


def test_an_update_keeps_a_route_admitted_before(webhook: Webhook) -> None:
    """A pod stored before the policy (or exempt then) may still have its labels changed."""
    old = route_pod("env-all", "team-a")
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"team": "a"}

    assert webhook.validate(new, operation="UPDATE", old=old).allowed


def ephemeral(*variables: dict[str, Any], **security: Any) -> dict[str, Any]:
    debugger: dict[str, Any] = {"name": "debugger", "image": "busybox:1.36", "env": list(variables)}
    if security:
        debugger["securityContext"] = security
    return debugger


@pytest.mark.parametrize(
    ("debugger", "route"),
    [
        (ephemeral(env("NVIDIA_VISIBLE_DEVICES", "all")), SupplyRoute.VISIBLE_DEVICES_ENV),
        (ephemeral(privileged=True), SupplyRoute.PRIVILEGED),
    ],
    ids=["env", "privileged"],
)
def test_an_ephemeral_container_may_not_add_a_route(
    webhook: Webhook, debugger: dict[str, Any], route: SupplyRoute
) -> None:
    """`kubectl debug` into a plain pod and into a GPU pod: an ephemeral container has no device of its
    own, so the variable would hand it every GPU of the node."""
    for body in (pod(container("main")), pod(container("main", {"nvidia.com/gpu": 1}))):
        old = webhook.admit(body)
        new = copy.deepcopy(old)
        new["spec"]["ephemeralContainers"] = [debugger]

        answer = webhook.validate(new, operation="UPDATE", old=old, subresource="ephemeralcontainers")

        assert not answer.allowed and f"route {route}" in answer.message
        new["spec"]["ephemeralContainers"] = [ephemeral()]
        assert webhook.validate(new, operation="UPDATE", old=old, subresource="ephemeralcontainers").allowed


@pytest.fixture
def allowing(tls: Tls, state: StateServer, tmp_path: Path) -> Iterator[Webhook]:
    """The webhook with a hardware file that allows the env route everywhere and exempts team-b."""
    path = tmp_path / "hardware.json"
    path.write_text(
        json.dumps(
            {
                "gpu_supply_routes": {"visible-devices-env": "allow"},
                "gpu_supply_exempt": {"team-b": ["*"]},
                "gpu_runtime_classes": ["nvidia", "gpu-runtime"],
            }
        )
    )
    with serve_webhook(tls, state, hardware_file=path) as served:
        yield served


def test_the_admin_allows_a_route_or_exempts_a_namespace_in_the_hardware_file(allowing: Webhook) -> None:
    assert allowing.validate(route_pod("env-all", "team-a")).allowed
    assert not allowing.validate(route_pod("privileged", "team-a")).allowed
    assert allowing.validate(route_pod("privileged", "team-b")).allowed
    renamed = pod(container("main"), runtimeClassName="gpu-runtime")
    assert "route gpu-runtime-class" in allowing.validate(renamed).message
    assert allowing.validate(pod(container("main"), runtimeClassName="nvidia-cdi")).allowed


@pytest.mark.parametrize("case", sorted(EVASION_PODS))
def test_a_route_spelled_as_the_toolkit_reads_it_is_refused(webhook: Webhook, case: str) -> None:
    body, route = EVASION_PODS[case]

    answer = webhook.validate(webhook.admit(copy.deepcopy(body)))

    assert not answer.allowed
    assert f"route {route}" in answer.message


def test_cuda_version_beside_a_gpu_asked_for_is_admitted() -> None:
    """The device plugin sets NVIDIA_VISIBLE_DEVICES in the container it serves: not a legacy image."""
    gpu = pod(with_env(container("main", {"nvidia.com/gpu": 1}), env("CUDA_VERSION", "12.4.1")))

    assert route_uses(gpu, DEFAULT_SUPPLY, asks_for_gpu=True) == []
