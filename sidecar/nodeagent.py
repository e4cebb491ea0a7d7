"""GPU measurements from the node agent of the pod's node (`GET /v1/pod-gpus` once per sample, with the pod's
projected token), for nodes where the sidecar holds no GPU and cannot map NVML's host PIDs to its pod. Same
`GpuBackend` boundary as NVML, standard library only; the sidecar stays the pod's reporter."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

from gpuaccounting.podgpus import POD_GPUS_PATH, PodGpu, PodGpus
from sidecar.gpus import BackendUnavailable, Device, GpuBackend, GpuSample, Resolution, Selector
from sidecar.sender import load_http_client


class NodeAgentBackend:
    """Devices and measurements from the agent; one request per sample tick, shared by the tick's devices."""

    def __init__(
        self,
        url: str,
        token_file: Path,
        timeout: float,
        max_age_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urlsplit(url)
        self._host = parts.hostname or "localhost"
        self._port = parts.port
        self._token_file = token_file
        self._timeout = timeout
        self._max_age = max_age_seconds
        self._clock = clock
        # Plain http:// on the node's own address: no OpenSSL in the sidecar (see load_http_client).
        self._http = load_http_client(https=False)
        self._answer: dict[str, PodGpu] = {}
        self._complete = False
        self._fetched_at: float | None = None

    def _fetch(self) -> None:
        try:
            token = self._token_file.read_text(encoding="utf-8").strip()
        except OSError as error:
            raise BackendUnavailable(f"node agent token unreadable: {error.strerror or error}") from None
        connection = self._http.HTTPConnection(self._host, self._port, timeout=self._timeout)
        try:
            connection.request("GET", POD_GPUS_PATH, headers={"Authorization": f"Bearer {token}"})
            response = connection.getresponse()
            payload = response.read()
        except (OSError, self._http.HTTPException) as error:
            raise BackendUnavailable(f"node agent unreachable: {type(error).__name__}: {error}") from None
        finally:
            connection.close()
        if response.status != 200:
            detail = payload[:200].decode("utf-8", "replace")
            raise BackendUnavailable(f"node agent answered HTTP {response.status}: {detail}")
        answer = cast(PodGpus, json.loads(payload))
        self._answer = {gpu["uuid"]: gpu for gpu in answer["gpus"]}
        self._complete = answer["complete"]
        self._fetched_at = self._clock()

    def open(self) -> str:
        self._fetch()
        return f"node agent {self._host}:{self._port}"

    def close(self) -> None:
        self._fetched_at = None

    def resolve(self, selectors: Sequence[Selector]) -> Resolution:
        """The agent's devices for this pod; the selectors are not needed, the agent knows better. While
        the kubelet named none (devices seen only through running processes) the list may still grow,
        so the monitor is told to ask again."""
        devices = [
            Device(uuid=gpu["uuid"], name=gpu["name"], parent_uuid=gpu["parent_uuid"])
            for gpu in self._answer.values()
        ]
        return Resolution(devices, incomplete=not self._complete)

    def sample(self, device: Device) -> GpuSample:
        if self._fetched_at is None or self._clock() - self._fetched_at >= self._max_age:
            self._fetch()
        gpu = self._answer.get(device.uuid)
        if gpu is None:
            return GpuSample(uuid=device.uuid, status="unavailable", name=device.name)
        return GpuSample(
            uuid=gpu["uuid"],
            status=gpu["status"],
            name=gpu["name"],
            parent_uuid=gpu["parent_uuid"],
            sm_util_pct=gpu["sm_util_pct"],
            mem_used_bytes=gpu["mem_used_bytes"],
            mem_total_bytes=gpu["mem_total_bytes"],
            energy_millijoules=gpu["energy_millijoules"],
            pod_sm_util_pct=gpu["pod_sm_util_pct"],
            pod_mem_used_bytes=gpu["pod_mem_used_bytes"],
            pod_process_count=gpu["pod_processes"],
        )


class AgentFirstBackend:
    """The node agent when it answers, else the pod's own NVML (HAMi or gpushare pods whose sidecar can
    load it). Each re-initialisation asks the agent first again, so an agent that starts later wins."""

    def __init__(self, agent: GpuBackend, local: GpuBackend) -> None:
        self._agent = agent
        self._local = local
        self._active: GpuBackend = agent

    def open(self) -> str:
        try:
            description = self._agent.open()
        except BackendUnavailable as agent_error:
            self._active = self._local
            try:
                return self._local.open()
            except BackendUnavailable as local_error:
                raise BackendUnavailable(f"{agent_error}; {local_error}") from None
        self._active = self._agent
        return description

    def close(self) -> None:
        self._active.close()

    def resolve(self, selectors: Sequence[Selector]) -> Resolution:
        return self._active.resolve(selectors)

    def sample(self, device: Device) -> GpuSample:
        return self._active.sample(device)
