"""Clusters in a fleet, and the keys that keep their namespaces and pods apart in one store.

A hub timekeeper serves its own cluster (the local one, unnamed) and member clusters, each with a name.
Every table keyed by namespace holds a *namespace key*: the bare name for the local cluster, so a
single-cluster install and its data are unchanged, and `<cluster>/<namespace>` for a member's. A namespace
is a DNS label, so the separator never occurs inside one (client-go keys objects `namespace/name` the same
way). Every table keyed by pod uid holds a *pod key* the same way (`pod_key`): a uid is unique in its own
cluster only, and a member's API server, whose admin may be hostile to every other cluster, answers any uid
it likes. Only the hub composes keys, from the cluster whose API server authenticated the caller: never
from a name the caller wrote into a body or path."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, TypeVar

from gpuaccounting.names import DNS_LABEL

SEPARATOR: Final = "/"
_LABEL = DNS_LABEL.removeprefix("^").removesuffix("$")
# A namespace key as a hub's own principals may write one (a pool's members): `[<cluster>/]<namespace>`.
NAMESPACE_KEY_PATTERN: Final = rf"^({_LABEL}{SEPARATOR})?{_LABEL}$"
NAMESPACE_KEY_LENGTH: Final = 63 + len(SEPARATOR) + 63
# What the export, /metrics and the dashboard call the local cluster.
LOCAL_CLUSTER_LABEL: Final = ""

V = TypeVar("V")


def namespace_key(cluster: str | None, namespace: str) -> str:
    """The key `namespace` of `cluster` (None: the local cluster) is stored under."""
    return namespace if cluster is None else f"{cluster}{SEPARATOR}{namespace}"


def pod_key(cluster: str | None, uid: str) -> str:
    """The key the time of the pod (or DRA claim) `uid` of `cluster` (None: the local cluster) is charged
    under in pod_coverage, the ledger and the hourly aggregates. A uid from member `b`'s API server then
    never names, touches or blocks another cluster's pod, whatever uid `b` answers; the local cluster's
    keys are its bare uids, as before fleets. A reported uid holds no separator (schemas.PodUid)."""
    return uid if cluster is None else f"{cluster}{SEPARATOR}{uid}"


def split_key(key: str) -> tuple[str | None, str]:
    """(cluster, name) of a namespace or pod key; cluster None for the local cluster."""
    cluster, separator, namespace = key.rpartition(SEPARATOR)
    return (cluster, namespace) if separator else (None, key)


def cluster_of(key: str) -> str | None:
    return split_key(key)[0]


def cluster_label(key: str) -> str:
    """The cluster a key's rows carry in the export and /metrics: its name, LOCAL_CLUSTER_LABEL locally."""
    cluster = cluster_of(key)
    return LOCAL_CLUSTER_LABEL if cluster is None else cluster


def in_cluster(entries: Mapping[str, V], cluster: str | None) -> dict[str, V]:
    """The entries of one cluster's namespaces, by bare namespace: what that cluster's webhook sees."""
    found: dict[str, V] = {}
    for key, value in entries.items():
        owner, namespace = split_key(key)
        if owner == cluster:
            found[namespace] = value
    return found


def keys_in_cluster(keys: Iterable[str], cluster: str | None) -> list[str]:
    """The keys of one cluster's namespaces."""
    return [key for key in keys if cluster_of(key) == cluster]
