"""The Kubernetes boundary's reads: gets and paged lists of pods, namespaces, nodes, quotas, DRA and
custom objects, as typed values or JSON."""

from __future__ import annotations

from typing import Any

from timekeeper.kube.core import DRA_GROUP, HTTP_NOT_FOUND, QUOTA_NAME, KubeCore
from timekeeper.kube.types import (
    JSON,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    KubeApiError,
    KubeUnavailableError,
    PodInfo,
    PodSnapshot,
    pod_info,
)


class KubeReads(KubeCore):
    """Gets and lists."""

    async def list_pods(self, label_selector: str | None = None, page_size: int = 500) -> PodSnapshot:
        """Every pod (in pages), with the resourceVersion to watch from."""
        pods: list[PodInfo] = []
        token: str | None = None
        resource_version = ""
        while True:
            query: dict[str, Any] = {"limit": page_size, "_continue": token, "label_selector": label_selector}
            page = await self._raw_json(
                self._core.list_pod_for_all_namespaces(
                    **query, _preload_content=False, _request_timeout=self._timeout
                )
            )
            meta = page.get("metadata") or {}
            resource_version = resource_version or meta.get("resourceVersion", "")
            pods.extend(pod_info(item) for item in page.get("items") or [])
            token = meta.get("continue")
            if not token:
                return PodSnapshot(tuple(pods), resource_version)

    async def read_pod(self, namespace: str, name: str) -> PodInfo | None:
        """One pod, as the API server has it now; None when it is gone (404)."""
        try:
            raw = await self._raw_json(
                self._core.read_namespaced_pod(
                    name, namespace, _preload_content=False, _request_timeout=self._timeout
                )
            )
        except KubeApiError as error:
            if error.status == HTTP_NOT_FOUND:
                return None
            raise
        return pod_info(raw)

    async def namespace_labels(self, page_size: int = 500) -> dict[str, dict[str, str]]:
        """Every namespace's labels (in pages), for the pools' selectors."""
        labels: dict[str, dict[str, str]] = {}
        token: str | None = None
        while True:
            query: dict[str, Any] = {"limit": page_size, "_continue": token}
            page = await self._raw_json(
                self._core.list_namespace(**query, _preload_content=False, _request_timeout=self._timeout)
            )
            for item in page.get("items") or []:
                meta = item.get("metadata") or {}
                labels[meta["name"]] = dict(meta.get("labels") or {})
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return labels

    async def cluster_id(self) -> str:
        """The cluster's identity: the uid of its `kube-system` namespace, the convention for a cluster id
        (KEP-2149's `cluster.clusterset.k8s.io` ClusterProperty is often set to it). Two kubeconfigs that
        reach one API server, under any address or credentials, read the same one."""
        namespace = await self._raw_json(
            self._core.read_namespace("kube-system", _preload_content=False, _request_timeout=self._timeout)
        )
        metadata = namespace.get("metadata") if isinstance(namespace, dict) else None
        uid = metadata.get("uid") if isinstance(metadata, dict) else None
        if not isinstance(uid, str) or not uid:
            raise KubeUnavailableError("namespace kube-system has no metadata.uid")
        return uid

    async def node_labels(self, name: str) -> dict[str, str]:
        """A node's labels; none for a node that is gone (404)."""
        try:
            node = await self._call(self._core.read_node(name, _request_timeout=self._timeout))
        except KubeApiError as error:
            if error.status == HTTP_NOT_FOUND:
                return {}
            raise
        return dict((node.metadata and node.metadata.labels) or {})

    async def list_dra_objects(self, version: str, plural: str, page_size: int = 500) -> list[JSON]:
        """Every ResourceClaim or ResourceSlice (`plural`) in all namespaces, in pages, as JSON."""
        items: list[JSON] = []
        token: str | None = None
        while True:
            query: dict[str, Any] = {"limit": page_size, "_continue": token}
            page = await self._raw_json(
                self._custom.list_cluster_custom_object(
                    DRA_GROUP,
                    version,
                    plural,
                    **query,
                    _preload_content=False,
                    _request_timeout=self._timeout,
                )
            )
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    async def managed_quota_namespaces(self) -> set[str]:
        """Namespaces holding a quota we manage (to remove the ones whose limit went away)."""
        quotas = await self._call(
            self._core.list_resource_quota_for_all_namespaces(
                label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}", _request_timeout=self._timeout
            )
        )
        return {q.metadata.namespace for q in quotas.items if q.metadata.name == QUOTA_NAME}

    async def list_custom_objects(self, group: str, version: str, plural: str) -> list[JSON]:
        """Every object of a custom resource, in all namespaces, as JSON (numbers with a fraction as
        Decimal: a budget is exact). Few objects: one page."""
        page = await self._raw_json(
            self._custom.list_cluster_custom_object(
                group, version, plural, _preload_content=False, _request_timeout=self._timeout
            ),
            exact=True,
        )
        return list(page.get("items") or [])

    async def list_served_objects(
        self,
        group: str,
        version: str,
        plural: str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
    ) -> list[JSON] | None:
        """Every object of a resource (in one namespace, or all), in pages, as JSON; None where the API
        server does not serve it (404: its CRDs are not installed)."""
        items: list[JSON] = []
        token: str | None = None
        while True:
            query: dict[str, Any] = {"limit": page_size, "_continue": token, "label_selector": label_selector}
            options = {**query, "_preload_content": False, "_request_timeout": self._timeout}
            if namespace is None:
                call = self._custom.list_cluster_custom_object(group, version, plural, **options)
            else:
                call = self._custom.list_namespaced_custom_object(
                    group, version, namespace, plural, **options
                )
            try:
                page = await self._raw_json(call)
            except KubeApiError as error:
                if error.status == HTTP_NOT_FOUND:
                    return None
                raise
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    async def read_cluster_object(self, group: str, version: str, plural: str, name: str) -> JSON | None:
        """One cluster-scoped object as JSON; None when it (or its resource) does not exist (404)."""
        try:
            return await self._raw_json(
                self._custom.get_cluster_custom_object(
                    group, version, plural, name, _preload_content=False, _request_timeout=self._timeout
                )
            )
        except KubeApiError as error:
            if error.status == HTTP_NOT_FOUND:
                return None
            raise
