"""The kubelet's PodResources API (v1, `List`) over its unix socket: which devices each pod was given. Every
device ID is kept (UUIDs, replica suffixes, IDs embedding a UUID, DRA's CDI names and triplets) and matched
against the node's NVML UUIDs by `nodeagent.attribution`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import grpc

from nodeagent.podresources.v1 import api_pb2, api_pb2_grpc


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """Every device ID the kubelet lists for one pod, over all its containers (device plugins and DRA)."""

    device_ids: tuple[str, ...] = ()
    dra_devices: tuple[str, ...] = field(default=())


def allocations(response: api_pb2.ListPodResourcesResponse) -> dict[tuple[str, str], PodAllocation]:
    """(namespace, pod name) -> the pod's device IDs, from a List answer."""
    found: dict[tuple[str, str], PodAllocation] = {}
    for pod in response.pod_resources:
        device_ids: list[str] = []
        dra: list[str] = []
        for container in pod.containers:
            for devices in container.devices:
                device_ids.extend(devices.device_ids)
            for claim in container.dynamic_resources:
                for resource in claim.claim_resources:
                    dra.append(resource.device_name)
                    dra.extend(cdi.name for cdi in resource.cdi_devices)
        if device_ids or dra:
            found[(pod.namespace, pod.name)] = PodAllocation(
                tuple(dict.fromkeys(device_ids)), tuple(dict.fromkeys(dra))
            )
    return found


class PodResourcesClient:
    """A gRPC channel to the kubelet's pod-resources socket; `list()` once per sample."""

    def __init__(self, socket: Path, timeout_seconds: float) -> None:
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        self._timeout = timeout_seconds

    def list(self) -> dict[tuple[str, str], PodAllocation]:
        """Raises grpc.RpcError when the kubelet does not answer."""
        return allocations(self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout))

    def close(self) -> None:
        self._channel.close()
