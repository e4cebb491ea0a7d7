"""The GPU routes beside the device plugin (gpuaccounting.supply): what each finds in a pod, and the
admin's policy in the hardware file, where nothing wrong is read as a default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuaccounting.hardware import HardwareConfigError, load_hardware
from gpuaccounting.supply import DEFAULT_SUPPLY, GpuSupply, SupplyRoute, refused_uses, route_uses
from tests.support.pods import container, pod
from tests.support.supply import ROUTE_PODS, env, ordinary_gpu_pod, with_env


@pytest.mark.parametrize("case", sorted(ROUTE_PODS))
def test_each_route_pod_uses_its_route(case: str) -> None:
    body, route = ROUTE_PODS[case]
    uses = route_uses(body, DEFAULT_SUPPLY, asks_for_gpu=False)
    assert {use.route for use in uses} == {route}


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/dev",
        "//dev/",
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-caps",
        "/dev/dri/renderD128",
        "/dev/null",
        "/run/nvidia/driver",
        "/var/run/nvidia",
        "/var/run/../dev",
        "/proc/1/root/dev",
    ],
)
def test_host_paths_holding_gpu_device_nodes_are_a_route(path: str) -> None:
    body = pod(container("main"), volumes=[{"name": "v", "hostPath": {"path": path}}])
    assert [u.route for u in route_uses(body, DEFAULT_SUPPLY, asks_for_gpu=False)] == [
        SupplyRoute.DEVICE_HOST_PATH
    ]


@pytest.mark.parametrize("path", ["/data", "/var/lib/kubelet/pod-resources", "/dev/shm", "/devices", "/etc"])
def test_other_host_paths_are_not(path: str) -> None:
    body = pod(container("main"), volumes=[{"name": "v", "hostPath": {"path": path}}])
    assert route_uses(body, DEFAULT_SUPPLY, asks_for_gpu=False) == []


def test_a_mount_under_the_device_list_root_is_found_however_spelled() -> None:
    main = container("main")
    main["volumeMounts"] = [{"name": "v", "mountPath": "/var/run/./nvidia-container-devices//GPU-1"}]
    body = pod(main, volumes=[{"name": "v", "emptyDir": {}}])
    assert [u.route for u in route_uses(body, DEFAULT_SUPPLY, asks_for_gpu=False)] == [
        SupplyRoute.DEVICE_LIST_MOUNT
    ]


def test_the_nvidia_runtime_class_is_a_route_only_for_a_pod_that_asks_for_no_gpu() -> None:
    body = pod(container("main"), runtimeClassName="nvidia")
    assert route_uses(body, DEFAULT_SUPPLY, asks_for_gpu=True) == []
    assert route_uses(ordinary_gpu_pod(), DEFAULT_SUPPLY, asks_for_gpu=True) == []


def test_variables_that_select_no_device_are_not_a_route() -> None:
    quiet = with_env(
        container("main"),
        env("NVIDIA_VISIBLE_DEVICES", "void"),
        env("NVIDIA_DRIVER_CAPABILITIES", "all"),
        env("CUDA_VISIBLE_DEVICES", "0"),
    )
    assert route_uses(pod(quiet), DEFAULT_SUPPLY, asks_for_gpu=False) == []


def test_an_exemption_is_by_namespace_and_service_account() -> None:
    body, _ = ROUTE_PODS["env-all"]
    agent = {**body, "spec": {**body["spec"], "serviceAccountName": "gpu-timekeeper-nodeagent"}}
    assert refused_uses(agent, "gpu-timekeeper-node", DEFAULT_SUPPLY, asks_for_gpu=False) == []
    assert refused_uses(body, "gpu-timekeeper-node", DEFAULT_SUPPLY, asks_for_gpu=False)
    assert refused_uses(agent, "team-a", DEFAULT_SUPPLY, asks_for_gpu=False)
    assert refused_uses(body, "gpu-operator", DEFAULT_SUPPLY, asks_for_gpu=False) == []


def write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "hardware.json"
    path.write_text(json.dumps(document))
    return path


def test_the_policy_is_read_from_the_hardware_file(tmp_path: Path) -> None:
    hardware = load_hardware(
        write(
            tmp_path,
            {
                "gpu_supply_routes": {"privileged": "allow", "cdi-annotation": "refuse"},
                "gpu_supply_exempt": {"ml-infra": ["runner", "builder"]},
                "gpu_runtime_classes": ["nvidia"],
            },
        )
    )
    assert hardware.supply == GpuSupply(
        allowed=frozenset({SupplyRoute.PRIVILEGED}),
        exempt=(("ml-infra", frozenset({"runner", "builder"})),),
        runtime_classes=frozenset({"nvidia"}),
    )


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"gpu_supply_routes": {"env": "refuse"}}, "unknown keys \\['env'\\]"),
        ({"gpu_supply_routes": {"privileged": "count"}}, "must be one of \\['refuse', 'allow'\\]"),
        ({"gpu_supply_routes": ["privileged"]}, "gpu_supply_routes must be an object"),
        ({"gpu_supply_exempt": {"ml": "runner"}}, "must be a list of ServiceAccount names"),
        ({"gpu_runtime_classes": "nvidia"}, "gpu_runtime_classes must be a list of RuntimeClass names"),
    ],
)
def test_a_wrong_policy_is_refused_at_start(tmp_path: Path, document: object, message: str) -> None:
    with pytest.raises(HardwareConfigError, match=message):
        load_hardware(write(tmp_path, document))
