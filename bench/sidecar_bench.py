"""The sidecar's footprint at 1 sample/s: resident memory and CPU share of one core, from /proc.

Runs `python -m sidecar` exactly as the pod does, twice side by side: with the real pynvml backend loading
the fake libnvidia-ml.so.1 (compiled from tests/support/fakenvml against nvml.h: 4 GPUs, one with 2 MIG
devices, so every sample makes real NVML calls through ctypes) and with the pure-Python fake backend.
Both report every 30 s to a local stand-in receiver. Targets: < 25 MB RSS, < 0.5 % of one core.

    .venv/bin/python -m bench.sidecar_bench --seconds 120
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO_ROOT, Figure, Section
from tests.sidecar.receiver import ReportReceiver
from tests.support.fakenvml.build import build, find_compiler, find_nvml_header

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


def measure(env: dict[str, str], seconds: float, receiver: ReportReceiver, pod_uid: str) -> Footprint:
    child = subprocess.Popen(
        [sys.executable, "-m", "sidecar"],
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


def run(seconds: float) -> Section:
    compiler, header = find_compiler(), find_nvml_header()
    if compiler is None or header is None:
        raise SystemExit("the benchmark needs a C compiler and nvml.h (the dev extra)")
    receiver = ReportReceiver().start()
    section = Section("Sidecar footprint at 1 sample/s, 30 s reports")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        library = build(work / "lib", compiler, header)
        (work / "scenario.txt").write_text(scenario())
        (work / "token").write_text(secrets.token_urlsafe(24))
        variants: dict[str, dict[str, str]] = {
            "pynvml + fake libnvidia-ml (4 GPUs, 2 MIG)": {
                "SIDECAR_NVML_BACKEND": "pynvml",
                "SIDECAR_NVML_LIBRARY": str(library),
                "FAKE_NVML_SCENARIO": str(work / "scenario.txt"),
                "NVIDIA_VISIBLE_DEVICES": "all",
            },
            "fake backend (1 GPU)": {"SIDECAR_NVML_BACKEND": "fake"},
        }
        with ThreadPoolExecutor(len(variants)) as pool:
            futures = {}
            for name, extra in variants.items():
                pod_uid = str(uuid.uuid4())
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
    receiver.stop()
    for name, footprint in results.items():
        section.figures += [
            Figure(f"RSS, {name}", footprint.rss_mb, "MiB", f"< {RSS_TARGET_MB:g} MB"),
            Figure(f"peak RSS, {name}", footprint.peak_rss_mb, "MiB", f"< {RSS_TARGET_MB:g} MB"),
            Figure(f"CPU, {name}", footprint.cpu_pct, "% of one core", f"< {CPU_TARGET_PCT:g} %"),
        ]
        section.notes.append(f"{name}: {footprint.reports} reports delivered during the run")
    section.notes.append(
        f"measured over {seconds:g} s after a {WARM_UP_SECONDS:g} s warm-up; RSS from /proc/<pid>/status "
        "(VmRSS, VmHWM), CPU from utime+stime in /proc/<pid>/stat"
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
