"""The one place the timekeeper talks to the Kubernetes API: kubernetes_asyncio behind typed coroutines,
so nothing else sees client models or `ApiException`s; pods are read as raw JSON, what the share
computation takes. KubeClient is one session (core.py) with its verbs split by kind, as kopf splits
its client: reads.py, watches.py, writes.py and reviews.py."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml
from kubernetes_asyncio import client, config

from timekeeper.kube.core import DEFAULT_LIMITS, KubeLimits
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
    @property
    def kube_max_response_bytes(self) -> int: ...
    @property
    def kube_max_list_items(self) -> int: ...
    @property
    def kube_max_list_pages(self) -> int: ...


def kube_limits(settings: KubeSettings) -> KubeLimits:
    """The bounds on what a member's API server may answer, as the settings say (docs/kubernetes.md)."""
    return KubeLimits(
        settings.kube_max_response_bytes, settings.kube_max_list_items, settings.kube_max_list_pages
    )


def own_limits(settings: KubeSettings) -> KubeLimits:
    """The hub's own API server's: one answer's bytes alone. Its lists are as long as its cluster's own
    limits let its tenants make them, and a bound there would let one tenant fail every pass."""
    return KubeLimits(settings.kube_max_response_bytes, list_items=None, list_pages=None)


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """Where the cluster is: in-cluster service account, else a kubeconfig (the default one when unset)."""

    in_cluster: bool | None = None  # None: in-cluster when KUBERNETES_SERVICE_HOST is set
    kubeconfig: Path | None = None
    context: str | None = None
    request_timeout_seconds: float = 10.0
    limits: KubeLimits = DEFAULT_LIMITS

    @classmethod
    def from_settings(cls, settings: KubeSettings) -> KubeConfig:
        return cls(
            settings.kube_in_cluster,
            settings.kubeconfig,
            settings.kube_context,
            settings.kube_request_timeout_seconds,
            own_limits(settings),
        )


# What a user entry of a member's kubeconfig may not hold: a command the client would run (`exec`), a plugin
# (`auth-provider`), or a file on the hub it would send to the member's server (`tokenFile`, the client
# certificate and key by path). A member's admin writes that kubeconfig; the hub runs with the database's
# credentials and every member's, so it takes only credentials the file itself carries.
UNSAFE_USER_FIELDS = ("exec", "auth-provider", "tokenFile", "client-certificate", "client-key")


def refuse_unsafe_kubeconfig(path: Path) -> None:
    """ValueError naming the first user entry of the kubeconfig at `path` that holds an UNSAFE_USER_FIELDS
    field (or a file that is no kubeconfig): checked before the client library reads it."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"member kubeconfig {path}: cannot be read: {error}") from error
    users = document.get("users") if isinstance(document, Mapping) else None
    for entry in users if isinstance(users, list) else ():
        user = entry.get("user") if isinstance(entry, Mapping) else None
        for field in UNSAFE_USER_FIELDS:
            if isinstance(user, Mapping) and field in user:
                name = entry.get("name") if isinstance(entry, Mapping) else None
                raise ValueError(
                    f"member kubeconfig {path}: user {name!r} has {field!r}; a member's credentials must be "
                    "carried in the file (token, client-certificate-data and client-key-data)"
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
        return cls(await load_configuration(config_), config_.request_timeout_seconds, config_.limits)
