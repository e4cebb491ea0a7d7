"""One pod per GPU route beside the device plugin (docs/security.md, "The GPU supply on a node"), as a
tenant would write it: the webhook's tests, the matchConditions' and the cluster layer's share them."""

from __future__ import annotations

import copy
from typing import Any

from gpuaccounting.supply import SupplyRoute
from tests.support.pods import container, pod

ISSUE_IMAGE = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"


def with_env(built: dict[str, Any], *variables: dict[str, Any]) -> dict[str, Any]:
    built["env"] = list(variables)
    return built


def env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def issue_pod(namespace: str = "team-a", name: str = "env-all") -> dict[str, Any]:
    """Issue 36's pod: no GPU asked, every GPU of the node through the toolkit's variable."""
    main = with_env({"name": "main", "image": ISSUE_IMAGE}, env("NVIDIA_VISIBLE_DEVICES", "all"))
    return pod(main, name=name, namespace=namespace, priorityClassName="gpu-in-budget")


def _privileged(**security: Any) -> dict[str, Any]:
    built = container("main")
    built["securityContext"] = security
    return built


def _mounted(path: str) -> dict[str, Any]:
    built = container("main")
    built["volumeMounts"] = [{"name": "devices", "mountPath": path}]
    return built


def _host_path(path: str) -> dict[str, Any]:
    return {"name": "devices", "hostPath": {"path": path}}


# name -> (the pod in namespace team-a, the route it uses). A test places it in its own namespace.
ROUTE_PODS: dict[str, tuple[dict[str, Any], SupplyRoute]] = {
    "env-all": (issue_pod(), SupplyRoute.VISIBLE_DEVICES_ENV),
    "env-beside-a-gpu": (
        pod(with_env(container("main", {"nvidia.com/gpu": 1}), env("NVIDIA_VISIBLE_DEVICES", "all"))),
        SupplyRoute.VISIBLE_DEVICES_ENV,
    ),
    "env-from-a-field": (
        pod(
            with_env(
                container("main"),
                {
                    "name": "NVIDIA_VISIBLE_DEVICES",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['devices']"}},
                },
            ),
            annotations={"devices": "all"},
        ),
        SupplyRoute.VISIBLE_DEVICES_ENV,
    ),
    "env-from-a-prefixed-config-map": (
        pod(container("main") | {"envFrom": [{"prefix": "NVIDIA_", "configMapRef": {"name": "devices"}}]}),
        SupplyRoute.VISIBLE_DEVICES_ENV,
    ),
    "env-in-an-init-container": (
        pod(container("main"), init=(with_env(container("setup"), env("NVIDIA_VISIBLE_DEVICES", "0,1")),)),
        SupplyRoute.VISIBLE_DEVICES_ENV,
    ),
    "mig-config-env": (
        pod(with_env(container("main"), env("NVIDIA_MIG_CONFIG_DEVICES", "all"))),
        SupplyRoute.VISIBLE_DEVICES_ENV,
    ),
    "imex-channels-env": (
        pod(with_env(container("main"), env("NVIDIA_IMEX_CHANNELS", "0"))),
        SupplyRoute.VISIBLE_DEVICES_ENV,
    ),
    "device-list-mount": (
        pod(
            _mounted("/var/run/nvidia-container-devices/all"),
            volumes=[{"name": "devices", "emptyDir": {}}],
        ),
        SupplyRoute.DEVICE_LIST_MOUNT,
    ),
    "cdi-annotation": (
        pod(container("main"), annotations={"cdi.k8s.io/gpus": "nvidia.com/gpu=all"}),
        SupplyRoute.CDI_ANNOTATION,
    ),
    "nri-cdi-annotation": (
        pod(container("main"), annotations={"nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=all"}),
        SupplyRoute.CDI_ANNOTATION,
    ),
    "runtime-class": (pod(container("main"), runtimeClassName="nvidia"), SupplyRoute.GPU_RUNTIME_CLASS),
    "host-path-device": (
        pod(_mounted("/dev/nvidia0"), volumes=[_host_path("/dev/nvidia0")]),
        SupplyRoute.DEVICE_HOST_PATH,
    ),
    "host-path-root": (
        pod(_mounted("/host"), volumes=[_host_path("/")]),
        SupplyRoute.DEVICE_HOST_PATH,
    ),
    "privileged": (pod(_privileged(privileged=True)), SupplyRoute.PRIVILEGED),
    "sys-admin": (pod(_privileged(capabilities={"add": ["SYS_ADMIN"]})), SupplyRoute.PRIVILEGED),
}


def route_pod(case: str, namespace: str, name: str | None = None) -> dict[str, Any]:
    """A copy of the route's pod in `namespace` (named after the case unless `name` says otherwise)."""
    body = copy.deepcopy(ROUTE_PODS[case][0])
    body["metadata"]["namespace"] = namespace
    body["metadata"]["name"] = name or case
    return body


def ordinary_gpu_pod(namespace: str = "team-a", name: str = "ordinary") -> dict[str, Any]:
    """A GPU asked the ordinary way, beside toolkit variables that select no device and the NVIDIA
    runtime class: admitted as before."""
    main = with_env(
        container("main", {"nvidia.com/gpu": 1}),
        env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
        env("NVIDIA_REQUIRE_CUDA", "cuda>=12.0"),
    )
    return pod(main, name=name, namespace=namespace, runtimeClassName="nvidia")


# Issue 36's fix attacked as the `edit` tenant would (tests/cluster/test_tenant_redsupply.py): spellings of a
# route the first cut let through. name -> (the pod in namespace team-a, the route it uses).
EVASION_PODS: dict[str, tuple[dict[str, Any], SupplyRoute]] = {
    # The toolkit's legacy image: CUDA_VERSION without NVIDIA_REQUIRE_CUDA or NVIDIA_VISIBLE_DEVICES is "all".
    "legacy-cuda-version": (
        pod(with_env(container("main"), env("CUDA_VERSION", "12.4.1"))),
        SupplyRoute.VISIBLE_DEVICES_ENV,
    ),
    "legacy-cuda-version-from-a-prefixed-config-map": (
        pod(container("main") | {"envFrom": [{"prefix": "CUDA_", "configMapRef": {"name": "cuda"}}]}),
        SupplyRoute.VISIBLE_DEVICES_ENV,
    ),
    # The toolkit's device list takes any mount path starting with its root: this one asks for "all".
    "device-list-mount-without-a-slash": (
        pod(
            _mounted("/var/run/nvidia-container-devicesall"),
            volumes=[{"name": "devices", "emptyDir": {}}],
        ),
        SupplyRoute.DEVICE_LIST_MOUNT,
    ),
    # NRI's device injector under its current keys: a device node with its cgroup rule, a CDI device, a
    # host mount (containerd/nri plugins/device-injector).
    "nri-device-annotation": (
        pod(
            container("main"),
            annotations={"devices.noderesource.dev/container.main": "- {path: /dev/nvidia0, type: c}"},
        ),
        SupplyRoute.CDI_ANNOTATION,
    ),
    "nri-cdi-device-annotation": (
        pod(container("main"), annotations={"cdi-devices.noderesource.dev/pod": "- nvidia.com/gpu=all"}),
        SupplyRoute.CDI_ANNOTATION,
    ),
    "nri-mount-annotation": (
        pod(
            container("main"),
            annotations={
                "mounts.noderesource.dev/pod": "- {source: /dev, destination: /host-dev, type: bind}"
            },
        ),
        SupplyRoute.CDI_ANNOTATION,
    ),
    # k3s and RKE2 create this RuntimeClass beside `nvidia` on a node with the toolkit.
    "k3s-experimental-runtime-class": (
        pod(container("main"), runtimeClassName="nvidia-experimental"),
        SupplyRoute.GPU_RUNTIME_CLASS,
    ),
}
