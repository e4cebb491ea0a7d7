"""The node agent's two loops: a sampler (NVML, the kubelet's PodResources, each GPU process's cgroup) and an
HTTP endpoint answering each sidecar with its own pod's devices and measurements. It reads no pod objects and
writes nothing to the API server: its ServiceAccount needs only `create tokenreviews`."""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc

from gpuaccounting.podgpus import POD_GPUS_PATH, PodGpus
from nodeagent.attribution import pod_gpus
from nodeagent.auth import PodIdentity, ReviewFailed, TokenReviewer
from nodeagent.cgroups import pod_uid_of
from nodeagent.config import Settings
from nodeagent.gpus import DeviceReading, NodeNvml, NvmlUnavailable
from nodeagent.kubelet import PodAllocation, PodResourcesClient
from nodeagent.supply import probe

log = logging.getLogger("nodeagent")


@dataclass(slots=True)
class Snapshot:
    """The latest sample of the node; replaced whole, so readers never see half of one."""

    readings: list[DeviceReading] = field(default_factory=list)
    allocations: dict[tuple[str, str], PodAllocation] = field(default_factory=dict)
    pod_of_pid: dict[int, str] = field(default_factory=dict)
    nvml_problem: str | None = None
    env_route_open: bool = False  # nodeagent.supply: this node hands GPUs for NVIDIA_VISIBLE_DEVICES alone


class Sampler:
    """Takes one Snapshot per tick; each source failing degrades its part, never the others."""

    def __init__(self, settings: Settings, nvml: NodeNvml, kubelet: PodResourcesClient) -> None:
        self._settings = settings
        self._nvml = nvml
        self._kubelet = kubelet
        self.snapshot = Snapshot()
        self._problems: dict[str, str | None] = {}

    def _announce(self, source: str, problem: str | None) -> None:
        """One log line per change of a source's health, not one per tick."""
        if self._problems.get(source, None) == problem:
            return
        self._problems[source] = problem
        if problem is None:
            log.info(f"{source}_available")
        else:
            log.warning(f"{source}_unavailable", extra={"reason": problem})

    def sample(self) -> Snapshot:
        readings: list[DeviceReading] = []
        problem = None
        try:
            readings = self._nvml.read()
        except NvmlUnavailable as error:
            problem = str(error)
            self._nvml.close()
        self._announce("nvml", problem)
        try:
            allocations = self._kubelet.list()
            self._announce("podresources", None)
        except grpc.RpcError as error:
            allocations = self.snapshot.allocations
            self._announce("podresources", f"{error.code()}: {error.details()}")  # type: ignore[attr-defined]
        pids = {pid for reading in readings for pid in (reading.processes or {})}
        pod_of_pid = {pid: uid for pid in pids if (uid := pod_uid_of(pid, self._settings.proc_root))}
        env_route = probe(os.environ, len(readings))
        if env_route and not self.snapshot.env_route_open:
            log.warning("gpu_env_route_open", extra={"devices": len(readings)})
        self.snapshot = Snapshot(readings, allocations, pod_of_pid, problem, env_route)
        return self.snapshot

    def answer(self, identity: PodIdentity) -> PodGpus:
        snapshot = self.snapshot
        return pod_gpus(
            identity.namespace,
            identity.pod,
            identity.pod_uid,
            snapshot.allocations.get((identity.namespace, identity.pod)),
            snapshot.readings,
            snapshot.pod_of_pid,
        )

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.sample()
            stop.wait(self._settings.sample_interval_seconds)


METRICS_PATH = "/metrics"
ENV_ROUTE_METRIC = "nodeagent_gpu_env_route_open"


def metrics_text(snapshot: Snapshot) -> str:
    """The Prometheus text of what the agent knows about its node (no pod's measurements: those are each
    pod's own)."""
    return (
        f"# HELP {ENV_ROUTE_METRIC} 1: this node's NVIDIA Container Toolkit handed this unprivileged agent"
        " GPUs for NVIDIA_VISIBLE_DEVICES alone, so any container setting it (or whose image does) gets"
        " GPUs beside the device plugin (docs/deployment.md); 0: not seen.\n"
        f"# TYPE {ENV_ROUTE_METRIC} gauge\n"
        f"{ENV_ROUTE_METRIC} {int(snapshot.env_route_open)}\n"
    )


def make_server(settings: Settings, sampler: Sampler, reviewer: TokenReviewer) -> ThreadingHTTPServer:
    """`GET /v1/pod-gpus` (bearer token: the caller's pod only), `GET /healthz` and `GET /metrics`."""

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, payload: object) -> None:
            body = json.dumps(payload, separators=(",", ":")).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._send(200, {"status": "ok"})
                return
            if self.path == METRICS_PATH:
                body = metrics_text(sampler.snapshot).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if self.path != POD_GPUS_PATH:
                self._send(404, {"detail": "not found"})
                return
            scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                self._send(401, {"detail": "a bearer token (the pod's projected token) is required"})
                return
            try:
                identity = reviewer.review(token.strip())
            except ReviewFailed as error:
                self._send(503, {"detail": f"cannot review the token now: {error}"})
                return
            if identity is None:
                self._send(401, {"detail": "not a pod-bound token for this audience"})
                return
            self._send(200, sampler.answer(identity))

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer((settings.host, settings.port), Handler)
    server.daemon_threads = True
    return server
