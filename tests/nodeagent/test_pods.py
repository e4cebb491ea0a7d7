"""Each pod's sidecar reports exactly its own pod's devices and, on a shared GPU, its own processes' use.

A real node agent (`python -m nodeagent`) reads a fake libnvidia-ml.so.1 (compiled from C against nvml.h)
with six GPUs, one of them in MIG mode, a fake kubelet speaking the real PodResources v1 proto over a
unix socket, a fake /proc whose cgroup files place NVML's host PIDs in pods, and a TokenReview stand-in.
Real sidecars (`SIDECAR_NVML_BACKEND=nodeagent`) report to a receiver. The pods, as docs/sidecar.md's
matrix lists them: a whole GPU, a MIG device, two pods time-slicing one GPU, a KAI fraction (the GPU is
held by KAI's reservation pod; the fractional pod only runs on it), HAMi (device IDs that embed the UUID)
and a DRA claim (a CDI device name that carries the UUID).
"""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuaccounting.podgpus import NODEAGENT_AUDIENCE, POD_GPUS_PATH
from tests.sidecar.receiver import ReportReceiver
from tests.support.fakekubelet import FakeKubelet, FakePod
from tests.support.processes import SidecarProcess, free_port, wait_until
from tests.support.tokenreview import TokenReviewServer

pytestmark = pytest.mark.e2e

GIB = 1024**3
GPU = [f"GPU-{k}{k}{k}{k}{k}{k}{k}{k}-0000-4000-8000-00000000000{k}" for k in range(6)]
MIG_1A = "MIG-11111111-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
MIG_1B = "MIG-11111111-bbbb-4bbb-8bbb-bbbbbbbbbbbb"


@dataclass
class Pod:
    name: str
    uid: str
    token: str
    pids: tuple[int, ...]


PODS = {
    name: Pod(name, str(uuid.uuid4()), secrets.token_urlsafe(16), pids)
    for name, pids in {
        "whole": (1001,),
        "mig": (2001,),
        "sliced-a": (3001,),
        "sliced-b": (4001, 4002),
        "kai": (5001,),
        "hami": (6001,),
        "dra": (7001,),
    }.items()
}

G80 = f"mem_total={80 * GIB}"
SCENARIO = "\n".join(
    [
        "driver 550.54.15",
        f"gpu {GPU[0]} util=70 {G80} mem_used={4 * GIB} energy_mj=1000 energy_step_mj=300000 "
        f"procs=1001:{4 * GIB} proc_util=1001:70",
        f"gpu {GPU[1]} {G80} mem_used={GIB}",
        f"mig {GPU[1]} {MIG_1A} name=NVIDIA_A100_MIG_1g.10gb mem_total={10 * GIB} mem_used={GIB} "
        f"unsupported=utilization,energy procs=2001:{GIB}",
        f"mig {GPU[1]} {MIG_1B} mem_total={10 * GIB} mem_used=0 unsupported=utilization,energy",
        f"gpu {GPU[2]} util=85 {G80} mem_used={3 * GIB} procs=3001:{2 * GIB},4001:{GIB},4002:0 "
        "proc_util=3001:60,4001:20,4002:5",
        f"gpu {GPU[3]} util=40 {G80} mem_used={3 * GIB} procs=5001:{3 * GIB} proc_util=5001:40",
        f"gpu {GPU[4]} util=30 {G80} mem_used={GIB} procs=6001:{GIB},9999:{GIB} proc_util=6001:30,9999:10",
        f"gpu {GPU[5]} util=50 {G80} mem_used={GIB} procs=7001:{GIB} proc_util=7001:50",
        "",
    ]
)

KUBELET_PODS = [
    FakePod("team-a", "whole", {"nvidia.com/gpu": [GPU[0]]}),
    FakePod("team-a", "mig", {"nvidia.com/mig-1g.10gb": [MIG_1A]}),
    FakePod("team-a", "sliced-a", {"nvidia.com/gpu": [f"{GPU[2]}::0"]}),
    FakePod("team-b", "sliced-b", {"nvidia.com/gpu": [f"{GPU[2]}::3"]}),
    FakePod("team-b", "kai", {}),
    FakePod("kai-resource-reservation", "gpu-reservation-node-1-x7k2p", {"nvidia.com/gpu": [GPU[3]]}),
    FakePod("team-c", "hami", {"nvidia.com/gpu": [f"{GPU[4]}-3"]}),
    FakePod(
        "team-c", "dra", dra=[("gpu.nvidia.com", "node-1", "gpu-5", [f"k8s.gpu.nvidia.com/gpu={GPU[5]}"])]
    ),
]
NAMESPACE = {pod.name: pod.namespace for pod in KUBELET_PODS}


@dataclass
class Node:
    agent_url: str
    tokens: TokenReviewServer
    kubelet: FakeKubelet
    agent: SidecarProcess


@pytest.fixture
def node(fake_nvml_library: Path, tmp_path: Path) -> Iterator[Node]:
    proc = tmp_path / "proc"
    for pod in PODS.values():
        for pid in pod.pids:
            (proc / str(pid)).mkdir(parents=True)
            slice_uid = pod.uid.replace("-", "_")
            (proc / str(pid) / "cgroup").write_text(
                f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice/"
                f"cri-containerd-{pid:064x}.scope\n"
            )
    (proc / "9999").mkdir()
    (proc / "9999" / "cgroup").write_text("0::/system.slice/someone-elses.service\n")
    scenario = tmp_path / "scenario.txt"
    scenario.write_text(SCENARIO)
    kubelet = FakeKubelet(tmp_path / "kubelet.sock", KUBELET_PODS).start()
    agent_token = secrets.token_urlsafe(16)
    tokens = TokenReviewServer(agent_token, NODEAGENT_AUDIENCE).start()
    for pod in PODS.values():
        tokens.tokens[pod.token] = (NAMESPACE[pod.name], pod.name, pod.uid)
    (tmp_path / "agent-token").write_text(agent_token)
    port = free_port()
    agent = SidecarProcess(
        {
            "NODEAGENT_HOST": "127.0.0.1",
            "NODEAGENT_PORT": str(port),
            "NODEAGENT_PODRESOURCES_SOCKET": str(kubelet.socket),
            "NODEAGENT_PROC_ROOT": str(proc),
            "NODEAGENT_SAMPLE_INTERVAL_SECONDS": "0.2",
            "NODEAGENT_NVML_LIBRARY": str(fake_nvml_library),
            "NODEAGENT_KUBERNETES_URL": tokens.url,
            "NODEAGENT_KUBERNETES_TOKEN_FILE": str(tmp_path / "agent-token"),
            "NODEAGENT_KUBERNETES_CA_FILE": "",
            "NODEAGENT_LOG_FORMAT": "json",
            "FAKE_NVML_SCENARIO": str(scenario),
        },
        tmp_path / "agent.log",
        module="nodeagent",
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _get(url, "/healthz")[0] == 200, what="the node agent")
    yield Node(url, tokens, kubelet, agent)
    agent.terminate()
    kubelet.stop()
    tokens.stop()


def _get(url: str, path: str, token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        url + path, headers={"Authorization": f"Bearer {token}"} if token else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except OSError:
        return 0, None


def _sidecar(
    tmp_path: Path, receiver: ReportReceiver, node: Node, pod: Pod, extra: dict[str, str] | None = None
) -> SidecarProcess:
    folder = tmp_path / pod.name
    folder.mkdir(parents=True)
    (folder / "token").write_text("timekeeper-token")
    (folder / "nodeagent-token").write_text(pod.token)
    env = {
        "POD_NAMESPACE": NAMESPACE.get(pod.name, "team-z"),
        "POD_NAME": pod.name,
        "POD_UID": pod.uid,
        "SIDECAR_GPU_SHARE": "0.5",
        "SIDECAR_TIMEKEEPER_URL": receiver.url,
        "SIDECAR_TOKEN_FILE": str(folder / "token"),
        "SIDECAR_BUFFER_DIR": str(folder / "buffer"),
        "SIDECAR_REPORT_INTERVAL_SECONDS": "1",
        "SIDECAR_SAMPLE_INTERVAL_SECONDS": "0.2",
        "SIDECAR_NVML_BACKEND": "nodeagent",
        "SIDECAR_NODEAGENT_URL": node.agent_url,
        "SIDECAR_NODEAGENT_TOKEN_FILE": str(folder / "nodeagent-token"),
        "SIDECAR_LOG_FORMAT": "json",
        **(extra or {}),
    }
    return SidecarProcess(env, folder / "sidecar.log")


def test_every_pod_reports_exactly_its_own_devices_and_its_own_use(
    tmp_path: Path, receiver: ReportReceiver, node: Node
) -> None:
    sidecars = {name: _sidecar(tmp_path, receiver, node, pod) for name, pod in PODS.items()}

    def figures(name: str) -> dict[str, dict[str, Any]]:
        """The GPUs of the pod's latest report that has figures."""
        bodies = [b for b in receiver.accepted() if b["pod"] == name and b["gpus"]]
        return {gpu["uuid"]: gpu for gpu in bodies[-1]["gpus"]} if bodies else {}

    wait_until(
        lambda: all(figures(name) for name in PODS), timeout=60, what="reports with figures from every pod"
    )
    for sidecar in sidecars.values():
        assert sidecar.terminate() == 0

    got = {name: figures(name) for name in PODS}
    assert {name: set(gpus) for name, gpus in got.items()} == {
        "whole": {GPU[0]},
        "mig": {MIG_1A},
        "sliced-a": {GPU[2]},
        "sliced-b": {GPU[2]},
        "kai": {GPU[3]},
        "hami": {GPU[4]},
        "dra": {GPU[5]},
    }
    whole = got["whole"][GPU[0]]
    assert (whole["sm_util_pct"], whole["pod_sm_util_pct"], whole["pod_mem_used_bytes"]) == (70, 70, 4 * GIB)
    assert whole["status"] == "ok" and whole["energy_joules"] > 0
    mig = got["mig"][MIG_1A]
    assert mig["parent_uuid"] == GPU[1] and mig["name"] == "NVIDIA_A100_MIG_1g.10gb"
    assert mig["status"] == "partial"  # NVML gives a MIG device no utilisation or energy
    assert mig["sm_util_pct"] is None and "pod_sm_util_pct" not in mig and mig["pod_mem_used_bytes"] == GIB
    # Time-slicing: the device says 85 % for both; each pod gets its own processes' share.
    a, b = got["sliced-a"][GPU[2]], got["sliced-b"][GPU[2]]
    assert a["sm_util_pct"] == b["sm_util_pct"] == 85
    assert (a["pod_sm_util_pct"], a["pod_mem_used_bytes"], a["pod_processes"]) == (60, 2 * GIB, 1)
    assert (b["pod_sm_util_pct"], b["pod_mem_used_bytes"], b["pod_processes"]) == (25, GIB, 2)
    assert got["kai"][GPU[3]]["pod_sm_util_pct"] == 40
    hami = got["hami"][GPU[4]]
    assert (hami["pod_sm_util_pct"], hami["pod_mem_used_bytes"]) == (30, GIB)  # not the host process 9999's
    assert got["dra"][GPU[5]]["pod_sm_util_pct"] == 50
    assert node.kubelet.calls > 0


def test_the_agent_answers_only_the_pod_whose_token_it_is(node: Node) -> None:
    status, whole = _get(node.agent_url, POD_GPUS_PATH, PODS["whole"].token)
    assert status == 200
    assert (whole["namespace"], whole["pod"], whole["pod_uid"]) == ("team-a", "whole", PODS["whole"].uid)
    assert [gpu["uuid"] for gpu in whole["gpus"]] == [GPU[0]]
    assert whole["complete"] is True
    status, kai = _get(node.agent_url, POD_GPUS_PATH, PODS["kai"].token)
    assert status == 200 and kai["complete"] is False  # seen only through its processes

    assert _get(node.agent_url, POD_GPUS_PATH)[0] == 401
    assert _get(node.agent_url, POD_GPUS_PATH, "not-a-pod-token")[0] == 401
    reviews = node.tokens.reviews
    for _ in range(3):
        _get(node.agent_url, POD_GPUS_PATH, PODS["whole"].token)
    assert node.tokens.reviews == reviews  # a reviewed token is cached, not reviewed per request


def test_a_sidecar_asks_its_node_agent_first_and_uses_its_own_nvml_where_none_answers(
    tmp_path: Path, receiver: ReportReceiver, node: Node, fake_nvml_library: Path
) -> None:
    """The webhook's injection: SIDECAR_NVML_BACKEND=pynvml with SIDECAR_NODEAGENT_URL set."""
    lone_pod = Pod("lone", str(uuid.uuid4()), "unused", ())
    scenario = tmp_path / "local.txt"
    scenario.write_text(f"gpu {GPU[3]} util=33 mem_total={GIB} mem_used=1\n")
    # Where no agent answers (a closed port), the sidecar reads its own NVML.
    lone_env_node = Node(f"http://127.0.0.1:{free_port()}", node.tokens, node.kubelet, node.agent)
    lone = _sidecar(
        tmp_path,
        receiver,
        lone_env_node,
        lone_pod,
        {
            "SIDECAR_NVML_BACKEND": "pynvml",
            "SIDECAR_NVML_LIBRARY": str(fake_nvml_library),
            "FAKE_NVML_SCENARIO": str(scenario),
            "NVIDIA_VISIBLE_DEVICES": "all",
        },
    )
    agent_first = _sidecar(tmp_path, receiver, node, PODS["sliced-a"], {"SIDECAR_NVML_BACKEND": "pynvml"})

    def gpus(name: str) -> list[dict[str, Any]]:
        bodies = [b for b in receiver.accepted() if b["pod"] == name and b["gpus"]]
        return bodies[-1]["gpus"] if bodies else []

    wait_until(lambda: gpus("lone") and gpus("sliced-a"), timeout=60, what="reports from both sidecars")
    assert lone.terminate() == 0 and agent_first.terminate() == 0

    (local,) = gpus("lone")
    assert (local["uuid"], local["sm_util_pct"]) == (GPU[3], 33) and "pod_sm_util_pct" not in local
    (shared,) = gpus("sliced-a")
    assert (shared["uuid"], shared["pod_sm_util_pct"]) == (GPU[2], 60)
