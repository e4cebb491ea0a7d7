"""Issue 36's fix attacked as a hostile tenant would (`edit` in its own namespace, its budget exhausted), on
the real API server with the shipped install: spellings of a GPU route beside the device plugin that the
toolkit reads and the first cut did not (tests/support/supply.py, EVASION_PODS), and what stays open
(docs/security.md, "Open, and known")."""

from __future__ import annotations

import copy
import json

import pytest

from tests.cluster.harness import Kubectl, Tenant, TimekeeperApi, wait_for_admission_state
from tests.cluster.test_tenant_supply import assert_refused_for
from tests.support.pods import container, pod
from tests.support.supply import EVASION_PODS, env, with_env


@pytest.fixture(scope="module", autouse=True)
def experimental_runtime_class(kubectl: Kubectl) -> None:
    """k3s's and RKE2's second NVIDIA RuntimeClass: the API server refuses a pod naming a missing one."""
    runtime_class = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia-experimental"},
        "handler": "nvidia-experimental",
    }
    kubectl.run("apply", "-f", "-", stdin=json.dumps(runtime_class))


@pytest.fixture(autouse=True)
def exhausted(tenant: Tenant, kubectl: Kubectl, api: TimekeeperApi) -> None:
    api.set_budget(tenant.namespace, 0)
    wait_for_admission_state(kubectl, tenant.namespace, "exhausted")


@pytest.mark.parametrize("case", sorted(EVASION_PODS))
def test_a_route_spelled_as_the_toolkit_reads_it_is_refused(tenant: Tenant, case: str) -> None:
    body, route = copy.deepcopy(EVASION_PODS[case])
    body["metadata"].update(namespace=tenant.namespace, name=case)

    assert_refused_for(tenant.kubectl.refusal(body), route)


@pytest.mark.parametrize(
    "variables",
    [
        [env("NVIDIA_VISIBLE_DEVICES", "void"), env("NVIDIA_VISIBLE_DEVICES", "all")],
        [env("NVIDIA_VISIBLE_DEVICES", " all")],
        [env("NVIDIA_VISIBLE_DEVICES", "GPU-0a1b2c3d-0000-0000-0000-000000000000")],
    ],
    ids=["last-of-two-wins", "leading-space", "a-gpu-uuid"],
)
def test_a_variable_spelled_otherwise_is_refused(tenant: Tenant, variables: list[dict[str, str]]) -> None:
    """Held on the first cut: the kubelet keeps the last of two, the toolkit trims each entry."""
    body = pod(with_env(container("main"), *variables), name="spelled", namespace=tenant.namespace)

    assert "route visible-devices-env" in tenant.kubectl.refusal(body)


@pytest.mark.xfail(
    strict=True,
    reason="a hostPath of the container runtime's socket hands every GPU (a privileged container made"
    " through it); only Pod Security's baseline level closes it (docs/security.md, Open, and known)",
)
def test_a_host_path_of_the_runtime_socket_is_refused(tenant: Tenant) -> None:
    main = container("main") | {"volumeMounts": [{"name": "runtime", "mountPath": "/run/containerd"}]}
    volume = {"name": "runtime", "hostPath": {"path": "/run/containerd/containerd.sock", "type": "Socket"}}
    body = pod(main, name="runtime-socket", namespace=tenant.namespace, volumes=[volume])

    assert "route device-host-path" in tenant.kubectl.refusal(body)


@pytest.mark.xfail(
    strict=True,
    reason="hostPID with SYS_PTRACE reaches another container's GPU process (ptrace, pidfd_getfd of its"
    " device files); only Pod Security's baseline level closes it (docs/security.md, Open, and known)",
)
def test_host_pid_with_ptrace_is_refused(tenant: Tenant) -> None:
    main = container("main") | {"securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}}
    body = pod(main, name="host-pid", namespace=tenant.namespace, hostPID=True)

    assert "route privileged" in tenant.kubectl.refusal(body)
