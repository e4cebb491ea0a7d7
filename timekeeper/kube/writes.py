"""The Kubernetes boundary's writes: evictions and deletions of pods, our ResourceQuotas, custom objects'
status and merge patches, and Events."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client

from gpuaccounting.names import DOMAIN
from gpuaccounting.quantity import parse_quantity
from timekeeper.kube.core import (
    COMPONENT,
    HTTP_CONFLICT,
    HTTP_NOT_FOUND,
    HTTP_TOO_MANY_REQUESTS,
    QUOTA_NAME,
    KubeCore,
)
from timekeeper.kube.types import (
    JSON,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    EvictionResult,
    KubeApiError,
    KubeError,
    ObjectReference,
    QuotaChange,
)


class KubeWrites(KubeCore):
    """Creates, patches, replaces, evictions and deletes."""

    async def evict_pod(
        self, namespace: str, name: str, *, dry_run: bool = False, grace_period_seconds: int | None = None
    ) -> EvictionResult:
        """Evict through the Eviction API, so PodDisruptionBudgets are honoured; with `dry_run`, only ask
        whether it would be allowed (nothing is evicted, no disruption spent). `grace_period_seconds`
        overrides the pod's own terminationGracePeriodSeconds for this deletion (None: the pod's)."""
        options: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
        body = client.V1Eviction(
            api_version=await self.eviction_api_version(),
            kind="Eviction",
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            delete_options=None
            if grace_period_seconds is None
            else client.V1DeleteOptions(grace_period_seconds=grace_period_seconds),
        )
        try:
            await self._read(
                self._core.create_namespaced_pod_eviction(
                    name,
                    namespace,
                    body,
                    _preload_content=False,
                    _request_timeout=self._timeout,
                    **options,
                )
            )
        except KubeApiError as error:
            if error.status == HTTP_TOO_MANY_REQUESTS:
                return EvictionResult.BLOCKED_BY_PDB
            if error.status == HTTP_NOT_FOUND:
                return EvictionResult.GONE
            raise
        return EvictionResult.EVICTED

    async def delete_pod(self, namespace: str, name: str, uid: str, grace_period_seconds: int) -> bool:
        """DELETE the pod (no PodDisruptionBudget is asked) with this grace period, only if it is still
        the pod `uid` (a pod re-created under the name is left alone); whether it was there to delete."""
        options = client.V1DeleteOptions(
            grace_period_seconds=grace_period_seconds, preconditions=client.V1Preconditions(uid=uid)
        )
        try:
            await self._read(
                self._core.delete_namespaced_pod(
                    name, namespace, body=options, _preload_content=False, _request_timeout=self._timeout
                )
            )
        except KubeApiError as error:
            if error.status in (HTTP_NOT_FOUND, HTTP_CONFLICT):  # gone, or another pod by now
                return False
            raise
        return True

    # ---- quotas ----------------------------------------------------------------------------------------

    async def apply_resource_quota(self, namespace: str, hard: Mapping[str, str]) -> QuotaChange:
        """Make the namespace's `gpu-timekeeper` ResourceQuota say exactly `hard`, correcting any drift."""
        for _ in range(3):
            try:
                return await self._apply_resource_quota_once(namespace, hard)
            except KubeApiError as error:
                if error.status != HTTP_CONFLICT:
                    raise
                # Someone changed it (or created it) between our read and write: read again.
        raise KubeError(f"quota in {namespace}: kept conflicting")

    async def _apply_resource_quota_once(self, namespace: str, hard: Mapping[str, str]) -> QuotaChange:
        labels = {MANAGED_BY_LABEL: MANAGED_BY}
        annotations = {f"{DOMAIN}/managed": "true"}
        try:
            current = await self._typed(
                self._core.read_namespaced_resource_quota(
                    QUOTA_NAME, namespace, _preload_content=False, _request_timeout=self._timeout
                ),
                "V1ResourceQuota",
            )
        except KubeApiError as error:
            if error.status != HTTP_NOT_FOUND:
                raise
            body = client.V1ResourceQuota(
                metadata=client.V1ObjectMeta(
                    name=QUOTA_NAME, namespace=namespace, labels=labels, annotations=annotations
                ),
                spec=client.V1ResourceQuotaSpec(hard=dict(hard)),
            )
            await self._read(
                self._core.create_namespaced_resource_quota(
                    namespace, body, _preload_content=False, _request_timeout=self._timeout
                )
            )
            return QuotaChange.CREATED
        current_labels = current.metadata.labels or {}
        current_hard = (current.spec.hard if current.spec else None) or {}
        if _same_quantities(current_hard, hard) and all(
            current_labels.get(k) == v for k, v in labels.items()
        ):
            return QuotaChange.UNCHANGED
        current.metadata.labels = {**current_labels, **labels}
        current.metadata.annotations = {**(current.metadata.annotations or {}), **annotations}
        current.spec = client.V1ResourceQuotaSpec(hard=dict(hard))
        # Carries the resourceVersion we read: a concurrent change answers 409 and we go round again.
        await self._read(
            self._core.replace_namespaced_resource_quota(
                QUOTA_NAME, namespace, current, _preload_content=False, _request_timeout=self._timeout
            )
        )
        return QuotaChange.UPDATED

    async def delete_resource_quota(self, namespace: str) -> QuotaChange:
        """Remove our quota from a namespace that no longer has a concurrent limit."""
        try:
            await self._read(
                self._core.delete_namespaced_resource_quota(
                    QUOTA_NAME, namespace, _preload_content=False, _request_timeout=self._timeout
                )
            )
        except KubeApiError as error:
            if error.status == HTTP_NOT_FOUND:
                return QuotaChange.ABSENT
            raise
        return QuotaChange.DELETED

    # ---- custom objects --------------------------------------------------------------------------------

    async def replace_custom_object_status(self, group: str, version: str, plural: str, obj: JSON) -> None:
        """Write an object's status subresource (`update` on <plural>/status). The body carries the
        resourceVersion read: a change since answers 409, and the caller writes again next time."""
        meta = obj["metadata"]
        # The API server takes nothing but the status from this write (the rest is the stored object's).
        body = {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion") if k in meta},
            "status": obj["status"],
        }
        options: dict[str, Any] = {"_preload_content": False, "_request_timeout": self._timeout}
        if meta.get("namespace"):
            call = self._custom.replace_namespaced_custom_object_status(
                group, version, meta["namespace"], plural, meta["name"], body, **options
            )
        else:
            call = self._custom.replace_cluster_custom_object_status(
                group, version, plural, meta["name"], body, **options
            )
        await self._read(call)

    async def merge_patch_object(
        self, group: str, version: str, plural: str, namespace: str, name: str, patch: JSON
    ) -> JSON:
        """A JSON merge patch (RFC 7386) of a namespaced object; a `metadata.resourceVersion` in it makes
        the write conditional (409 when the object changed since it was read)."""
        # The client would send a dict as a strategic merge patch, which custom resources refuse.
        options: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
        return await self._raw_json(
            self._custom.patch_namespaced_custom_object(
                group,
                version,
                namespace,
                plural,
                name,
                patch,
                _preload_content=False,
                _request_timeout=self._timeout,
                **options,
            )
        )

    # ---- events ----------------------------------------------------------------------------------------

    async def post_event(
        self,
        namespace: str,
        reason: str,
        message: str,
        type_: str = "Normal",
        involved: ObjectReference | None = None,
    ) -> None:
        """Record a Kubernetes Event (`kubectl get events -n <namespace>` shows it) about the namespace or a
        pod. The API server refuses an Event whose involvedObject.namespace differs from its own namespace
        (outside `default`), so one about the Namespace carries the namespace there too."""
        involved = involved or ObjectReference(kind="Namespace", name=namespace)
        now = datetime.now(UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                name=f"{involved.name}.{int(now.timestamp() * 1e9):x}", namespace=namespace
            ),
            involved_object=client.V1ObjectReference(
                api_version=involved.api_version,
                kind=involved.kind,
                name=involved.name,
                namespace=involved.namespace or namespace,
                uid=involved.uid,
            ),
            reason=reason,
            message=message[:1024],
            type=type_,
            source=client.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            reporting_instance=self._instance,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        await self._read(
            self._core.create_namespaced_event(
                namespace, body, _preload_content=False, _request_timeout=self._timeout
            )
        )


def _same_quantities(current: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """Quantities compare by value: the API server may canonicalise "0.5" to "500m"."""
    if set(current) != set(wanted):
        return False
    return all(parse_quantity(current[k]) == parse_quantity(wanted[k]) for k in wanted)
