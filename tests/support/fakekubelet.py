"""A stand-in for the kubelet's PodResources service: a real gRPC server speaking the vendored v1 proto on
a unix socket, answering List/Get/GetAllocatableResources from the pods a test gives it."""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from nodeagent.podresources.v1 import api_pb2, api_pb2_grpc


@dataclass
class FakePod:
    namespace: str
    name: str
    # resource name -> device IDs, for the pod's one container
    devices: dict[str, list[str]] = field(default_factory=dict)
    # DRA: (driver, pool, device name, CDI device names)
    dra: list[tuple[str, str, str, list[str]]] = field(default_factory=list)

    def message(self) -> api_pb2.PodResources:
        claims = [
            api_pb2.DynamicResource(
                claim_name=f"{self.name}-gpu",
                claim_namespace=self.namespace,
                claim_resources=[
                    api_pb2.ClaimResource(
                        driver_name=driver,
                        pool_name=pool,
                        device_name=device,
                        cdi_devices=[api_pb2.CDIDevice(name=name) for name in cdi],
                    )
                ],
            )
            for driver, pool, device, cdi in self.dra
        ]
        container = api_pb2.ContainerResources(
            name="main",
            devices=[
                api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
                for resource, ids in self.devices.items()
            ],
            dynamic_resources=claims,
        )
        return api_pb2.PodResources(name=self.name, namespace=self.namespace, containers=[container])


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, socket: Path, pods: list[FakePod]) -> None:
        self.socket = socket
        self.pods = pods
        self.calls = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{socket}")

    def List(
        self, request: api_pb2.ListPodResourcesRequest, context: object
    ) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        return api_pb2.ListPodResourcesResponse(pod_resources=[pod.message() for pod in self.pods])

    def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        for pod in self.pods:
            if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                return api_pb2.GetPodResourcesResponse(pod_resources=pod.message())
        context.abort(grpc.StatusCode.NOT_FOUND, "pod not found")
        raise AssertionError("unreachable")

    def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: object
    ) -> api_pb2.AllocatableResourcesResponse:
        return api_pb2.AllocatableResourcesResponse()

    def start(self) -> FakeKubelet:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)
