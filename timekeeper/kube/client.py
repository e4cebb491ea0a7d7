"""The one place the timekeeper talks to the Kubernetes API: kubernetes_asyncio behind typed coroutines,
so nothing else sees client models or `ApiException`s; pods are read as raw JSON, what the share
computation takes. KubeClient is one session (core.py) with its verbs split by kind, as kopf splits
its client: reads.py, watches.py, writes.py and reviews.py."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kubernetes_asyncio import client, config

from timekeeper.kube.reviews import KubeReviews
from timekeeper.kube.watches import KubeWatches
from timekeeper.kube.writes import KubeWrites


class KubeSettings(Protocol):
    """The settings a KubeConfig is read from (timekeeper.settings.Settings has them)."""

    @property
    def kube_in_cluster(self) -> bool | None: ...
    @property
    def kubeconfig(self) -> Path | None: ...
    @property
    def kube_context(self) -> str | None: ...
    @property
    def kube_request_timeout_seconds(self) -> float: ...


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """Where the cluster is: in-cluster service account, else a kubeconfig (the default one when unset)."""

    in_cluster: bool | None = None  # None: in-cluster when KUBERNETES_SERVICE_HOST is set
    kubeconfig: Path | None = None
    context: str | None = None
    request_timeout_seconds: float = 10.0

    @classmethod
    def from_settings(cls, settings: KubeSettings) -> KubeConfig:
        return cls(
            settings.kube_in_cluster,
            settings.kubeconfig,
            settings.kube_context,
            settings.kube_request_timeout_seconds,
        )


async def load_configuration(config_: KubeConfig) -> client.Configuration:
    """A client Configuration for the cluster, without touching the client's process-wide default."""
    configuration = client.Configuration()
    in_cluster = config_.in_cluster
    if in_cluster is None:
        in_cluster = "KUBERNETES_SERVICE_HOST" in os.environ
    if in_cluster:
        # Re-reads the rotating projected token before it expires.
        # kubernetes_asyncio leaves this one unannotated.
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(
            config_file=str(config_.kubeconfig) if config_.kubeconfig else None,
            context=config_.context,
            client_configuration=configuration,
            persist_config=False,
        )
    return configuration


class KubeClient(KubeWatches, KubeWrites, KubeReviews):
    """Typed access to the few Kubernetes APIs the timekeeper uses. Build it on the event loop."""

    @classmethod
    async def from_config(cls, config_: KubeConfig) -> KubeClient:
        return cls(await load_configuration(config_), config_.request_timeout_seconds)
