"""The sidecar's and the node agent's RSS and CPU at 1 sample/s, from /proc: `python -m sidecar` with pynvml
over the fake libnvidia-ml, the fake backend and the node-agent backend, beside `python -m nodeagent` on an
8-GPU fake node with a fake kubelet. `python -m bench.sidecar_bench --seconds 120`."""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO_ROOT, Figure, Section
from gpuaccounting.podgpus import NODEAGENT_AUDIENCE
from tests.sidecar.receiver import ReportReceiver
from tests.support.fakekubelet import FakeKubelet, FakePod
from tests.support.fakenvml.build import build, find_compiler, find_nvml_header
from tests.support.processes import free_port
from tests.support.tokenreview import TokenReviewServer

GIB = 1024**3
WARM_UP_SECONDS = 5.0
RSS_TARGET_MB = 25.0
CPU_TARGET_PCT = 0.5


def scenario() -> str:
    gpus = [f"GPU-{index:08d}-0000-4000-8000-{secrets.token_hex(6)}" for index in range(4)]
    lines = ["driver 560.35.03"]
    for gpu in gpus:
        lines.append(
            f"gpu {gpu} util=10,40,70,95 mem_total={80 * GIB} mem_used={30 * GIB} "
            f"energy_mj=1000 energy_step_mj=250000 procs=4242:{10 * GIB},4243:{20 * GIB}"
        )
    for child in range(2):
        lines.append(
            f"mig {gpus[3]} MIG-{child:08d}-1111-4000-8000-{secrets.token_hex(6)} mem_total={10 * GIB} "
            f"mem_used={GIB} unsupported=utilization,energy"
        )
    return "\n".join(lines) + "\n"


@dataclass
class Footprint:
    rss_mb: float
    peak_rss_mb: float
    cpu_pct: float
    reports: int


def _status_kib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return float(line.split()[1])
    raise KeyError(field)


def _cpu_seconds(pid: int) -> float:
    # Fields 14 and 15 of /proc/<pid>/stat (utime, stime) in clock ticks; the name may contain spaces.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def node_scenario() -> tuple[str, dict[str, list[int]], list[str]]:
    """8 GPUs, each with one or two pods' processes (GPUs 6 and 7 time-sliced between two pods each):
    the scenario, pod name -> its PIDs, and the GPU UUIDs."""
    gpus = [f"GPU-{index:08d}-2222-4000-8000-{secrets.token_hex(6)}" for index in range(8)]
    pods: dict[str, list[int]] = {}
    lines = ["driver 550.54.15"]
    for index, gpu in enumerate(gpus):
        tenants = [f"pod-{index}"] + ([f"pod-{index}-b"] if index >= 6 else [])
        pids = {name: [1000 * (index + 1) + 10 * t + k for k in range(2)] for t, name in enumerate(tenants)}
        pods.update(pids)
        procs = ",".join(f"{pid}:{GIB}" for group in pids.values() for pid in group)
        util = ",".join(
            f"{pid}:{10 + k}" for k, pid in enumerate(p for group in pids.values() for p in group)
        )
        lines.append(
            f"gpu {gpu} util=20,60,90 mem_total={80 * GIB} mem_used={8 * GIB} energy_mj=1000 "
            f"energy_step_mj=250000 procs={procs} proc_util={util}"
        )
    return "\n".join(lines) + "\n", pods, gpus


def measure(
    env: dict[str, str], seconds: float, receiver: ReportReceiver, pod_uid: str, module: str = "sidecar"
) -> Footprint:
    child = subprocess.Popen(
        [sys.executable, "-m", module],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(WARM_UP_SECONDS)
        cpu_start, wall_start = _cpu_seconds(child.pid), time.monotonic()
        time.sleep(seconds)
        cpu = _cpu_seconds(child.pid) - cpu_start
        wall = time.monotonic() - wall_start
        rss, peak = _status_kib(child.pid, "VmRSS"), _status_kib(child.pid, "VmHWM")
    finally:
        child.terminate()
        child.wait(timeout=30)
    reports = sum(1 for r in receiver.requests if r.body.get("pod_uid") == pod_uid)
    return Footprint(rss / 1024, peak / 1024, 100 * cpu / wall, reports)


def start_node(
    work: Path, library: Path, receiver_token: str
) -> tuple[dict[str, str], dict[str, str], Callable[[], None]]:
    """The node agent's surroundings (fake kubelet, fake /proc, TokenReview stand-in): the agent's
    environment, a pod's sidecar variables for the agent, and a callable that stops the stand-ins."""
    text, pods, gpus = node_scenario()
    (work / "node-scenario.txt").write_text(text)
    proc = work / "proc"
    uids = {name: str(uuid.uuid4()) for name in pods}
    for name, pids in pods.items():
        for pid in pids:
            (proc / str(pid)).mkdir(parents=True)
            (proc / str(pid) / "cgroup").write_text(
                f"0::/kubepods.slice/kubepods-pod{uids[name]}.slice/cri-x.scope\n"
            )
    kubelet_pods = [
        FakePod(
            "bench",
            name,
            {"nvidia.com/gpu": [f"{gpus[int(name.split('-')[1])]}::{0 if name.count('-') == 1 else 1}"]},
        )
        for name in pods
    ]
    kubelet = FakeKubelet(work / "kubelet.sock", kubelet_pods).start()
    tokens = TokenReviewServer(receiver_token, NODEAGENT_AUDIENCE).start()
    tokens.tokens["bench-pod-token"] = ("bench", "pod-6", uids["pod-6"])
    (work / "agent-token").write_text(receiver_token)
    (work / "nodeagent-token").write_text("bench-pod-token")
    port = free_port()
    agent_env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO_ROOT),
        "NODEAGENT_HOST": "127.0.0.1",
        "NODEAGENT_PORT": str(port),
        "NODEAGENT_PODRESOURCES_SOCKET": str(kubelet.socket),
        "NODEAGENT_PROC_ROOT": str(proc),
        "NODEAGENT_NVML_LIBRARY": str(library),
        "NODEAGENT_KUBERNETES_URL": tokens.url,
        "NODEAGENT_KUBERNETES_TOKEN_FILE": str(work / "agent-token"),
        "NODEAGENT_KUBERNETES_CA_FILE": "",
        "NODEAGENT_LOG_FORMAT": "json",
        "FAKE_NVML_SCENARIO": str(work / "node-scenario.txt"),
    }
    sidecar_env = {
        "SIDECAR_NVML_BACKEND": "nodeagent",
        "SIDECAR_NODEAGENT_URL": f"http://127.0.0.1:{port}",
        "SIDECAR_NODEAGENT_TOKEN_FILE": str(work / "nodeagent-token"),
        "POD_NAME": "pod-6",
        "POD_UID": uids["pod-6"],
    }

    def stop() -> None:
        kubelet.stop()
        tokens.stop()

    return agent_env, sidecar_env, stop


def run(seconds: float) -> Section:
    compiler, header = find_compiler(), find_nvml_header()
    if compiler is None or header is None:
        raise SystemExit("the benchmark needs a C compiler and nvml.h (the dev extra)")
    receiver = ReportReceiver().start()
    section = Section("Sidecar and node agent footprint at 1 sample/s, 30 s reports")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        library = build(work / "lib", compiler, header)
        (work / "scenario.txt").write_text(scenario())
        (work / "token").write_text(secrets.token_urlsafe(24))
        agent_env, agent_sidecar, stop_node = start_node(work, library, secrets.token_urlsafe(24))
        variants: dict[str, dict[str, str]] = {
            "pynvml + fake libnvidia-ml (4 GPUs, 2 MIG)": {
                "SIDECAR_NVML_BACKEND": "pynvml",
                "SIDECAR_NVML_LIBRARY": str(library),
                "FAKE_NVML_SCENARIO": str(work / "scenario.txt"),
                "NVIDIA_VISIBLE_DEVICES": "all",
            },
            "fake backend (1 GPU)": {"SIDECAR_NVML_BACKEND": "fake"},
            "node-agent backend (a time-sliced GPU)": agent_sidecar,
        }
        with ThreadPoolExecutor(len(variants) + 1) as pool:
            agent = pool.submit(measure, agent_env, seconds + WARM_UP_SECONDS, receiver, "", "nodeagent")
            # The agent first: the node-agent sidecar starts once the agent is serving.
            time.sleep(WARM_UP_SECONDS)
            futures = {}
            for name, extra in variants.items():
                pod_uid = extra.get("POD_UID") or str(uuid.uuid4())
                env = {
                    "PATH": os.environ.get("PATH", ""),
                    "PYTHONPATH": str(REPO_ROOT),
                    "POD_NAMESPACE": "bench",
                    "POD_NAME": "bench-0",
                    "POD_UID": pod_uid,
                    "SIDECAR_GPU_SHARE": "1",
                    "SIDECAR_TIMEKEEPER_URL": receiver.url,
                    "SIDECAR_TOKEN_FILE": str(work / "token"),
                    "SIDECAR_BUFFER_DIR": str(work / f"buffer-{pod_uid}"),
                    **extra,
                }
                futures[name] = pool.submit(measure, env, seconds, receiver, pod_uid)
            results = {name: future.result() for name, future in futures.items()}
            node = agent.result()
        stop_node()
    receiver.stop()
    for name, footprint in results.items():
        section.figures += [
            Figure(f"RSS, {name}", footprint.rss_mb, "MiB", f"< {RSS_TARGET_MB:g} MB"),
            Figure(f"peak RSS, {name}", footprint.peak_rss_mb, "MiB", f"< {RSS_TARGET_MB:g} MB"),
            Figure(f"CPU, {name}", footprint.cpu_pct, "% of one core", f"< {CPU_TARGET_PCT:g} %"),
        ]
        section.notes.append(f"{name}: {footprint.reports} reports delivered during the run")
    section.figures += [
        Figure("node agent RSS, 8-GPU node", node.rss_mb, "MiB", "dcgm-exporter: 400-500 MiB"),
        Figure("node agent peak RSS, 8-GPU node", node.peak_rss_mb, "MiB", ""),
        Figure("node agent CPU, 8-GPU node, 1 sample/s", node.cpu_pct, "% of one core", ""),
    ]
    section.notes.append(
        f"measured over {seconds:g} s after a {WARM_UP_SECONDS:g} s warm-up; RSS from /proc/<pid>/status "
        "(VmRSS, VmHWM), CPU from utime+stime in /proc/<pid>/stat"
    )
    section.notes.append(
        "node agent: 8 GPUs (two time-sliced), 10 pods with 20 GPU processes, PodResources List + NVML "
        "(utilisation, memory, energy, process list, per-process utilisation) + /proc/<pid>/cgroup every "
        "second, one sidecar asking every second; measured over the same window"
    )
    return section


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=120.0, help="measurement window (default 120)")
    section = run(parser.parse_args().seconds)
    print(f"## {section.title}")
    for figure in section.figures:
        print(f"{figure.name:55} {figure.value:8.3f} {figure.unit:14} target {figure.target}")
    for note in section.notes:
        print(f"- {note}")


if __name__ == "__main__":
    main()
