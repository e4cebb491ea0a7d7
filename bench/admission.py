"""Webhook admission benchmark: server-side latency per request kind through the ASGI app in-process, and
admissions/s of `python -m webhook` over TLS under wrk beside the bare ASGI baseline on the same uvicorn.
Run: `python -m bench.admission [--seconds 10]`; writes bench/out/webhook.md."""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import orjson

from bench.common import (
    PYTHON,
    REPO_ROOT,
    Figure,
    Section,
    asgi_caller,
    free_port,
    percentile,
    process,
    write_results,
)
from bench.wrk import WrkResult, run_wrk
from gpuaccounting.admission_state import AdmissionSnapshot, compact, default_priority_policy
from tests.support.pods import review
from webhook.certificates.tls import generate_ca, generate_serving_cert
from webhook.reviews.review import AdmissionReview, parse_review
from webhook.serving.app import create_app
from webhook.settings import WebhookSettings

OUT = REPO_ROOT / "bench" / "out" / "webhook.md"


def _pod(gpu: bool) -> dict[str, Any]:
    """A realistic pod: a few containers with env, probes and volumes, one of them asking for a GPU share."""
    main: dict[str, Any] = {
        "name": "trainer",
        "image": "registry.example/team-a/trainer:2.4.1",
        "command": ["python", "-m", "train"],
        "args": ["--epochs", "10"],
        "env": [{"name": f"VAR_{i}", "value": str(i)} for i in range(12)],
        "ports": [{"containerPort": 8080, "name": "http"}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 5},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "resources": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"memory": "16Gi"}},
    }
    if gpu:
        main["resources"]["requests"] |= {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50"}
        main["resources"]["limits"] |= {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50"}
    logger = {"name": "logger", "image": "fluent/fluent-bit:3.1", "resources": {"requests": {"cpu": "50m"}}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "trainer-",
            "namespace": "team-a",
            "labels": {"app": "trainer", "team": "a", "job-name": "trainer-1"},
            "annotations": {"team.example/owner": "alice", "prometheus.io/scrape": "true"},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "trainer-1", "uid": str(uuid.uuid4())}
            ],
        },
        "spec": {
            "containers": [main, logger],
            "initContainers": [{"name": "fetch", "image": "busybox:1.36", "command": ["true"]}],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "restartPolicy": "Never",
            "serviceAccountName": "default",
            "priority": 0,
            "preemptionPolicy": "PreemptLowerPriority",
        },
    }


def _review(path: str, gpu: bool) -> bytes:
    pod = _pod(gpu)
    if path == "/validate" and gpu:  # /validate sees the final object, after our mutation
        pod = _mutated(pod)
    return orjson.dumps(review(pod, username="system:serviceaccount:kube-system:job-controller"))


def _snapshot(namespaces: int) -> AdmissionSnapshot:
    policy = default_priority_policy()
    return compact(
        1,
        "2026-11-22T00:00:00Z",
        {"in_budget": "gpu-in-budget", "over_budget": "gpu-over-budget"},
        {"state": "in_budget", "max_gpu_share_per_pod": None, "priority_policy": policy},
        {
            f"team-{i}": {"state": "in_budget", "max_gpu_share_per_pod": 4.0, "priority_policy": policy}
            for i in range(namespaces)
        },
    )


# No timekeeper and no API server: the webhook answers on its documented missing-state policy and the
# settings' class numbers, exactly as fast. In-process and as a process alike, so the sidecar the
# mutation injects is the one /validate expects.
NO_TIMEKEEPER = "http://127.0.0.1:9"


def _settings() -> WebhookSettings:
    return WebhookSettings(watch_priority_classes=False, timekeeper_url=NO_TIMEKEEPER)


def _mutated(pod: dict[str, Any]) -> dict[str, Any]:
    app = create_app(_settings())
    app.state.cache.store(_snapshot(10), '"1"')
    answer = app.state.admission.mutate(_parse(pod).request)
    return jsonpatch.apply_patch(pod, list(answer.patch))


def _parse(pod: dict[str, Any]) -> AdmissionReview:
    return parse_review(
        orjson.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {
                    "uid": "u",
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "namespace": "team-a",
                    "operation": "CREATE",
                    "object": copy.deepcopy(pod),
                },
            }
        )
    )


async def _server_side(samples: int, rounds: int = 10) -> dict[str, tuple[list[float], list[float]]]:
    """Wall-clock and CPU time per request, in µs, by kind; the kinds take turns in rounds, so a burst of
    other work on the machine lands on all of them alike. CPU time is what the request itself cost."""
    app = create_app(_settings())
    app.state.cache.store(_snapshot(10_000), '"1"')
    calls = {
        f"{path[1:]} {'GPU' if gpu else 'non-GPU'} pod": asgi_caller(app, path, _review(path, gpu))
        for path in ("/mutate", "/validate")
        for gpu in (True, False)
    }
    timings: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label in calls}
    for call in calls.values():
        for _ in range(500):  # warm up
            await call()
    for _ in range(rounds):
        for label, call in calls.items():
            wall, cpu = timings[label]
            for _ in range(samples // rounds):
                started, started_cpu = time.perf_counter_ns(), time.thread_time_ns()
                await call()
                cpu.append((time.thread_time_ns() - started_cpu) / 1000)
                wall.append((time.perf_counter_ns() - started) / 1000)
    return timings


@dataclass
class Load:
    """wrk results of one kind summed over rounds: the rate over all of them, the worst round's p99."""

    requests: int = 0
    seconds: float = 0.0
    errors: int = 0
    p99_ms: float = 0.0

    def add(self, result: WrkResult) -> None:
        self.requests += result.requests
        self.seconds += result.seconds
        self.errors += result.errors
        self.p99_ms = max(self.p99_ms, result.p99_ms)

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def _throughput(seconds: int, connections: int, directory: Path, rounds: int = 5) -> dict[str, Load]:
    """The webhook and the bare ASGI baseline run side by side; each round drives every kind and the
    baseline in turn for seconds/rounds, so changing load on a shared machine falls on all alike."""
    ca_cert, ca_key = generate_ca("bench CA")
    cert, key = generate_serving_cert(ca_cert, ca_key, "webhook", "bench", extra_sans=("127.0.0.1",))
    (directory / "tls.crt").write_bytes(cert)
    (directory / "tls.key").write_bytes(key)
    tls_env = {
        "WEBHOOK_TLS_CERT_FILE": str(directory / "tls.crt"),
        "WEBHOOK_TLS_KEY_FILE": str(directory / "tls.key"),
    }
    webhook_port, bare_port = free_port(), free_port()
    targets: dict[str, tuple[str, Path]] = {}
    for path in ("/mutate", "/validate"):
        for gpu in (True, False):
            label = f"{path[1:]} {'GPU' if gpu else 'non-GPU'} pod"
            body = directory / f"{path[1:]}-{'gpu' if gpu else 'plain'}.json"
            body.write_bytes(_review(path, gpu))
            targets[label] = (f"https://127.0.0.1:{webhook_port}{path}", body)
    targets["bare ASGI"] = (f"https://127.0.0.1:{bare_port}/", targets["mutate GPU pod"][1])
    env = {
        **tls_env,
        "WEBHOOK_TIMEKEEPER_URL": NO_TIMEKEEPER,
        "WEBHOOK_LOG_FORMAT": "json",
        "WEBHOOK_WATCH_PRIORITY_CLASSES": "false",
    }
    webhook = [PYTHON, "-m", "webhook", "--host", "127.0.0.1", "--port", str(webhook_port)]
    bare = [
        PYTHON, "-m", "uvicorn", "bench.bare_asgi:app", "--host", "127.0.0.1", "--port", str(bare_port),
        "--ssl-certfile", tls_env["WEBHOOK_TLS_CERT_FILE"], "--ssl-keyfile", tls_env["WEBHOOK_TLS_KEY_FILE"],
        "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    loads = {label: Load() for label in targets}
    with process(webhook, env=env, port=webhook_port), process(bare, port=bare_port):
        for _ in range(rounds):
            for label, (url, body) in targets.items():
                result = run_wrk(
                    url,
                    "admission.lua",
                    [str(body)],
                    seconds=max(1, seconds // rounds),
                    connections=connections,
                )
                loads[label].add(result)
    return loads


def run(seconds: int = 10, connections: int = 16, samples: int = 20_000) -> Section:
    section = Section("Webhook admission")
    load_before = os.getloadavg()[0]
    for label, (wall, cpu) in asyncio.run(_server_side(samples)).items():
        section.figures += [
            Figure(f"server-side p50, {label}", percentile(wall, 0.50), "µs"),
            Figure(f"server-side p99, {label}", percentile(wall, 0.99), "µs", target="< 2,000 µs"),
            Figure(f"server-side CPU p99, {label}", percentile(cpu, 0.99), "µs"),
        ]
    with tempfile.TemporaryDirectory() as scratch:
        loads = _throughput(seconds, connections, Path(scratch))
    baseline = loads.pop("bare ASGI")
    for label, result in loads.items():
        if result.errors:
            section.notes.append(f"{label}: {result.errors} errors under load")
        section.figures.append(
            Figure(
                f"admissions/s over HTTPS, {label}",
                result.rate,
                "req/s",
                target="≥ 2,000 req/s",
                baseline=baseline.rate,
                baseline_name="bare ASGI, same uvicorn + TLS",
            )
        )
        section.figures.append(Figure(f"client-observed p99 under load, {label}", result.p99_ms, "ms"))
    section.notes.append(
        f"1-minute load average before / after: {load_before:.2f} / {os.getloadavg()[0]:.2f}"
        " (other work on this machine inflates the tails)"
    )
    section.notes.append(
        f"server-side: {samples:,} sequential requests per kind through the ASGI app in-process (kinds"
        " interleaved in rounds), 10,000 namespaces in the cached state; a realistic 2-container Job pod"
        " (HAMi request for GPU pods); CPU p99 is the thread's CPU time, which other processes cannot inflate"
    )
    section.notes.append(
        f"throughput: wrk, {connections} keep-alive TLS connections, {seconds}s per kind in all, against"
        " `python -m webhook` (one process), in 5 rounds alternating with the baseline; wrk and the server"
        " share this machine's cores; p99 is the worst round's"
    )
    return section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--samples", type=int, default=20_000)
    args = parser.parse_args()
    section = run(args.seconds, args.connections, args.samples)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    write_results([section], OUT)
    print(OUT.read_text())


if __name__ == "__main__":
    main()
