"""What the node agent tells a sidecar about its pod's GPUs (`GET /v1/pod-gpus`, answered only for the pod
whose token is presented), as plain typed dictionaries both read from this one definition."""

from __future__ import annotations

from typing import Literal, TypedDict

from gpuaccounting.wire import GpuStatus

POD_GPUS_PATH = "/v1/pod-gpus"
# The agent's port on every node (its DaemonSet's hostPort); the webhook points sidecars at it.
NODEAGENT_PORT = 9402
# The audience of the projected token a sidecar presents to its node agent: not the timekeeper's, so a
# token the agent sees can never be replayed as a report.
NODEAGENT_AUDIENCE = "gpu-timekeeper-nodeagent"

# How the agent learned that a device is the pod's: the kubelet's PodResources (device plugins, DRA), a
# scheduler's annotation, or the pod's own processes seen on the device (cgroup of each NVML process).
DeviceSource = Literal["podresources", "processes"]


class PodGpu(TypedDict):
    """One device of the pod as the agent last sampled it. Device-wide measurements include every tenant of a
    shared GPU; `pod_*` measurements are the pod's own processes (None where NVML cannot attribute them)."""

    uuid: str
    status: GpuStatus
    source: DeviceSource
    name: str | None
    parent_uuid: str | None
    sm_util_pct: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    energy_millijoules: int | None
    pod_sm_util_pct: float | None
    pod_mem_used_bytes: int | None
    pod_processes: int | None


class PodGpus(TypedDict):
    """The answer: the pod's devices and whether the list is final (False while the kubelet named none
    and only running processes could say, so the sidecar asks again later)."""

    namespace: str
    pod: str
    pod_uid: str
    complete: bool
    gpus: list[PodGpu]
