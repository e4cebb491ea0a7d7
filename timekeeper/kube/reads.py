"""The Kubernetes boundary's reads: gets and paged lists of pods, namespaces, nodes, quotas, DRA and
custom objects, as typed values or JSON."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from timekeeper.kube.core import DRA_GROUP, HTTP_NOT_FOUND, QUOTA_NAME, AnswerTooLarge, KubeCore
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

    async def _pages(
        self, ask: Callable[[dict[str, Any]], Awaitable[Any]], page_size: int, exact: bool = False
    ) -> AsyncIterator[JSON]:
        """Each page of a paged list, as JSON: `ask(options)` requests one page (its `limit` and `_continue`
        among the options), following `continue` for no more than KubeLimits.list_pages requests and
        list_items items: a member's API server may answer pages forever, or one page after another full.
        A page past the byte bound is asked again with half the items, down to one, and the next page at
        full size: a tenant's few large objects (up to etcd's 1.5 MiB each) fail no list."""
        limits = self._limits
        token: str | None = None
        items, limit = 0, page_size
        for _ in itertools.count() if limits.list_pages is None else range(limits.list_pages):
            options = {"limit": limit, "_continue": token, "_preload_content": False}
            try:
                page = await self._raw_json(ask({**options, "_request_timeout": self._timeout}), exact)
            except AnswerTooLarge:
                if limit == 1:
                    raise
                limit = max(1, limit // 2)
                continue
            limit = page_size
            items += len(page.get("items") or ())
            if limits.list_items is not None and items > limits.list_items:
                raise KubeUnavailableError(
                    f"kubernetes API listed more than {limits.list_items} items (list_items)"
                )
            yield page
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return
        raise KubeUnavailableError(
            f"kubernetes API listed more than {limits.list_pages} pages (the list_pages bound)"
        )

    async def list_pods(self, label_selector: str | None = None, page_size: int = 500) -> PodSnapshot:
        """Every pod (in pages), with the resourceVersion to watch from."""
        pods: list[PodInfo] = []
        resource_version = ""
        selector: dict[str, Any] = {"label_selector": label_selector}
        pages = self._pages(
            lambda options: self._core.list_pod_for_all_namespaces(**selector, **options), page_size
        )
        async for page in pages:
            resource_version = resource_version or (page.get("metadata") or {}).get("resourceVersion", "")
            pods.extend(pod_info(item) for item in page.get("items") or [])
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
        async for page in self._pages(lambda options: self._core.list_namespace(**options), page_size):
            for item in page.get("items") or []:
                meta = item.get("metadata") or {}
                labels[meta["name"]] = dict(meta.get("labels") or {})
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
            node = await self._typed(
                self._core.read_node(name, _preload_content=False, _request_timeout=self._timeout), "V1Node"
            )
        except KubeApiError as error:
            if error.status == HTTP_NOT_FOUND:
                return {}
            raise
        return dict((node.metadata and node.metadata.labels) or {})

    async def list_dra_objects(self, version: str, plural: str, page_size: int = 500) -> list[JSON]:
        """Every ResourceClaim or ResourceSlice (`plural`) in all namespaces, in pages, as JSON."""
        items: list[JSON] = []
        pages = self._pages(
            lambda options: self._custom.list_cluster_custom_object(DRA_GROUP, version, plural, **options),
            page_size,
        )
        async for page in pages:
            items.extend(page.get("items") or [])
        return items

    async def managed_quota_namespaces(self) -> set[str]:
        """Namespaces holding a quota we manage (to remove the ones whose limit went away)."""
        quotas = await self._typed(
            self._core.list_resource_quota_for_all_namespaces(
                label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}",
                _preload_content=False,
                _request_timeout=self._timeout,
            ),
            "V1ResourceQuotaList",
        )
        return {q.metadata.namespace for q in quotas.items if q.metadata.name == QUOTA_NAME}

    async def list_custom_objects(
        self, group: str, version: str, plural: str, page_size: int = 500
    ) -> list[JSON]:
        """Every object of a custom resource, in all namespaces, in pages, as JSON (numbers with a fraction
        as Decimal: a budget is exact)."""
        items: list[JSON] = []
        pages = self._pages(
            lambda options: self._custom.list_cluster_custom_object(group, version, plural, **options),
            page_size,
            exact=True,
        )
        async for page in pages:
            items.extend(page.get("items") or [])
        return items

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

        def ask(options: dict[str, Any]) -> Awaitable[Any]:
            options = {**options, "label_selector": label_selector}
            if namespace is None:
                return self._custom.list_cluster_custom_object(group, version, plural, **options)
            return self._custom.list_namespaced_custom_object(group, version, namespace, plural, **options)

        items: list[JSON] = []
        try:
            async for page in self._pages(ask, page_size):
                items.extend(page.get("items") or [])
        except KubeApiError as error:
            if error.status == HTTP_NOT_FOUND:
                return None
            raise
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
