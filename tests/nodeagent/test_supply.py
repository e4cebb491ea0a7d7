"""The node agent's probe of its node's GPU supply (nodeagent.supply): the agent asks for its GPUs through
NVIDIA_VISIBLE_DEVICES alone, so seeing any, unprivileged and without a device-list mount, proves that the
node's toolkit honours the variable for every container; `/metrics` says so."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.app import ENV_ROUTE_METRIC, Sampler, metrics_text
from nodeagent.config import Settings
from nodeagent.gpus import DeviceReading
from nodeagent.supply import env_route_open

UNPRIVILEGED = "Name:\tpython\nCapEff:\t0000000000000000\n"
PRIVILEGED = "Name:\tpython\nCapEff:\t000001ffffffffff\n"
PLAIN_MOUNTS = "22 1 0:21 / / rw - overlay overlay rw\n"
DEVICE_LIST = PLAIN_MOUNTS + "30 22 0:5 /null /var/run/nvidia-container-devices/all ro - devtmpfs udev rw\n"
ASKED = {"NVIDIA_VISIBLE_DEVICES": "all"}


def test_gpus_seen_by_the_variable_alone_prove_the_route_open() -> None:
    assert env_route_open(ASKED, 8, UNPRIVILEGED, PLAIN_MOUNTS)


@pytest.mark.parametrize(
    ("environ", "devices", "status", "mountinfo"),
    [
        (ASKED, 0, UNPRIVILEGED, PLAIN_MOUNTS),  # the toolkit ignored the variable (or NVML is away)
        ({}, 8, UNPRIVILEGED, PLAIN_MOUNTS),  # not asked by the variable
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, 8, UNPRIVILEGED, PLAIN_MOUNTS),
        (ASKED, 8, PRIVILEGED, PLAIN_MOUNTS),  # honoured for a privileged container whatever the setting
        (ASKED, 8, UNPRIVILEGED, DEVICE_LIST),  # the devices came by the volume-mount list
    ],
    ids=["no-gpu-seen", "not-asked", "void", "privileged", "device-list-mount"],
)
def test_no_proof_is_no_alarm(environ: dict[str, str], devices: int, status: str, mountinfo: str) -> None:
    assert not env_route_open(environ, devices, status, mountinfo)


class _Nvml:
    def read(self) -> list[DeviceReading]:
        return [DeviceReading(uuid="GPU-0", name="H100")]

    def close(self) -> None:
        return None


class _Kubelet:
    def list(self) -> dict[Any, Any]:
        return {}


def test_the_agent_exports_what_it_saw(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("nodeagent.app.probe", lambda environ, devices: devices > 0)
    sampler = Sampler(Settings(), _Nvml(), _Kubelet())  # type: ignore[arg-type]
    assert f"{ENV_ROUTE_METRIC} 0\n" in metrics_text(sampler.snapshot)

    sampler.sample()

    assert f"{ENV_ROUTE_METRIC} 1\n" in metrics_text(sampler.snapshot)
