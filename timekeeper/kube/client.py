"""The one place the timekeeper talks to the Kubernetes API: kubernetes_asyncio behind typed coroutines,
so nothing else sees client models or `ApiException`s; pods are read as raw JSON, what the share
computation takes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol, TypeVar

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from gpuaccounting.backoff import Backoff
from gpuaccounting.names import DOMAIN
from gpuaccounting.quantity import parse_quantity
from timekeeper.kube.types import (
    JSON,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    EvictionResult,
    KubeApiError,
    KubeError,
    KubeUnavailableError,
    ObjectReference,
    PodEvent,
    PodInfo,
    PodSnapshot,
    QuotaChange,
    TokenReviewResult,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

COMPONENT = "gpu-timekeeper"
QUOTA_NAME = "gpu-timekeeper"
HTTP_GONE = 410
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
HTTP_TOO_MANY_REQUESTS = 429
DRA_GROUP = "resource.k8s.io"
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")  # the newest the API server serves is read
# How the pod watch retries after an error: from half a second, doubling, to at most 30 s apart.
WATCH_BACKOFF_BASE_SECONDS = 0.5
WATCH_BACKOFF_CAP_SECONDS = 30.0


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
        config.load_incluster_config(client_configuration=configuration)
    else:
        await config.load_kube_config(
            config_file=str(config_.kubeconfig) if config_.kubeconfig else None,
            context=config_.context,
            client_configuration=configuration,
            persist_config=False,
        )
    return configuration


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def pod_info(raw: JSON) -> PodInfo:
    """The typed view of a pod's JSON."""
    meta, spec, status = raw["metadata"], raw.get("spec") or {}, raw.get("status") or {}
    finished = [
        _parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for cs in status.get("containerStatuses") or []
    ]
    phase = status.get("phase") or "Pending"
    known_finishes = [f for f in finished if f is not None]
    return PodInfo(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta["uid"],
        phase=phase,
        resource_version=meta.get("resourceVersion", ""),
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
        node_name=spec.get("nodeName"),
        created_at=_parse_time(meta.get("creationTimestamp")),
        started_at=_parse_time(status.get("startTime")),
        finished_at=max(known_finishes) if phase in ("Succeeded", "Failed") and known_finishes else None,
        deleting_since=_parse_time(meta.get("deletionTimestamp")),
        raw=raw,
    )


class _Gone(Exception):
    """The watch's resourceVersion is too old (410 Gone / Expired): list again."""


def _error(exc: ApiException) -> KubeError:
    if exc.status is None or exc.status == 0 or exc.status >= 500:
        return KubeUnavailableError(f"kubernetes API error {exc.status}: {exc.reason}")
    return KubeApiError(exc.status, str(exc.reason))


class KubeClient:
    """Typed access to the few Kubernetes APIs the timekeeper uses. Build it on the event loop."""

    def __init__(self, configuration: client.Configuration, request_timeout_seconds: float = 10.0) -> None:
        self._api = client.ApiClient(configuration)
        self._core = client.CoreV1Api(self._api)
        self._authn = client.AuthenticationV1Api(self._api)
        self._authz = client.AuthorizationV1Api(self._api)
        self._custom = client.CustomObjectsApi(self._api)
        self._timeout = request_timeout_seconds
        self._instance = os.environ.get("HOSTNAME", COMPONENT)
        self._eviction_api_version: str | None = None
        self._dra_version: str | None = None

    @classmethod
    async def from_config(cls, config_: KubeConfig) -> KubeClient:
        return cls(await load_configuration(config_), config_.request_timeout_seconds)

    async def close(self) -> None:
        await self._api.close()

    async def _call(self, call: Awaitable[T]) -> T:
        """Await a client call, turning its failures into KubeApiError (4xx) or KubeUnavailableError
        (transport failures, timeouts and 5xx: worth retrying later)."""
        try:
            return await call
        except ApiException as exc:
            raise _error(exc) from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeUnavailableError(f"kubernetes API unreachable: {exc!r}") from exc

    # ---- authentication and authorisation --------------------------------------------------------------

    async def token_review(self, token: str, audiences: tuple[str, ...]) -> TokenReviewResult:
        """Ask the API server who a bearer token stands for (and whether it is meant for `audiences`)."""
        body = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=list(audiences)))
        review = await self._call(self._authn.create_token_review(body, _request_timeout=self._timeout))
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            return TokenReviewResult(authenticated=False, error=(status.error or "") if status else "")
        user = status.user
        return TokenReviewResult(
            authenticated=True,
            username=user.username or "",
            uid=user.uid or "",
            groups=tuple(user.groups or ()),
            extra={k: tuple(v or ()) for k, v in (user.extra or {}).items()},
            audiences=tuple(status.audiences or ()),
        )

    async def subject_access_review(
        self,
        user: str,
        groups: tuple[str, ...],
        verb: str,
        resource: str,
        group: str,
        namespace: str | None,
    ) -> bool:
        """Whether RBAC (or any authorizer) lets the user perform the verb on the resource."""
        attributes = client.V1ResourceAttributes(
            verb=verb, resource=resource, group=group, namespace=namespace or ""
        )
        body = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=user, groups=list(groups), resource_attributes=attributes
            )
        )
        review = await self._call(
            self._authz.create_subject_access_review(body, _request_timeout=self._timeout)
        )
        return bool(review.status and review.status.allowed and not review.status.denied)

    # ---- pods ------------------------------------------------------------------------------------------

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

    async def _raw_json(self, call: Awaitable[Any], exact: bool = False) -> JSON:
        """The JSON body of an unparsed answer (`_preload_content=False` answers the aiohttp response
        itself, status unchecked); `exact`: fractions as Decimal, as the API server wrote them."""
        response: aiohttp.ClientResponse = await self._call(call)
        async with response:
            body = await self._call(response.read())
            if not 200 <= response.status < 300:
                raise _error(ApiException(status=response.status, reason=body.decode(errors="replace")))
        parsed: JSON = json.loads(body, parse_float=Decimal) if exact else json.loads(body)
        return parsed

    async def watch_pods(
        self,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
        backoff: Backoff | None = None,
    ) -> AsyncGenerator[PodSnapshot | PodEvent, None]:
        """A snapshot, then every change, until the consumer stops: list, watch from its resourceVersion,
        resume from the last event or bookmark, list again on 410, back off on errors. Each snapshot is the
        full truth (pods missing from it are gone)."""
        backoff = backoff or Backoff(WATCH_BACKOFF_BASE_SECONDS, WATCH_BACKOFF_CAP_SECONDS)
        resource_version: str | None = None
        while True:
            try:
                if resource_version is None:
                    snapshot = await self.list_pods(label_selector)
                    resource_version = snapshot.resource_version
                    backoff.reset()
                    yield snapshot
                async for item in self._watch_once(resource_version, label_selector, timeout_seconds):
                    if isinstance(item, str):
                        resource_version = item
                        continue
                    resource_version = item.pod.resource_version or resource_version
                    backoff.reset()
                    yield item
            except _Gone:
                log.info("pod_watch_expired", extra={"resource_version": resource_version})
                resource_version = None
            except KubeError as exc:
                delay = backoff.next_delay()
                log.warning("pod_watch_failed", extra={"error": str(exc), "retry_in_seconds": delay})
                await asyncio.sleep(delay)

    async def _watch_once(
        self, resource_version: str, label_selector: str | None, timeout_seconds: int
    ) -> AsyncIterator[PodEvent | str]:
        """One watch request (the API server ends it after `timeout_seconds`): pod events, and bare
        resourceVersions from bookmarks."""
        # return_type "object": events carry the pod's JSON, not a deserialised V1Pod.
        watch = Watch(return_type="object")
        try:
            async with watch:
                stream = watch.stream(
                    self._core.list_pod_for_all_namespaces,
                    resource_version=resource_version,
                    label_selector=label_selector,
                    timeout_seconds=timeout_seconds,
                    allow_watch_bookmarks=True,
                    _request_timeout=(self._timeout, timeout_seconds + self._timeout),
                )
                async for event in stream:
                    if event["type"] == "BOOKMARK":
                        yield event["raw_object"]["metadata"]["resourceVersion"]
                    else:
                        yield PodEvent(event["type"], pod_info(event["raw_object"]))
        except ApiException as exc:
            if exc.status == HTTP_GONE:
                raise _Gone from exc
            raise _error(exc) from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeUnavailableError(f"pod watch interrupted: {exc!r}") from exc

    async def node_labels(self, name: str) -> dict[str, str]:
        """A node's labels; none for a node that is gone (404)."""
        try:
            node = await self._call(self._core.read_node(name, _request_timeout=self._timeout))
        except KubeApiError as error:
            if error.status == HTTP_NOT_FOUND:
                return {}
            raise
        return dict((node.metadata and node.metadata.labels) or {})

    async def eviction_api_version(self) -> str:
        """`policy/v1` where the API server serves it (1.22 on), else `policy/v1beta1` (1.20, 1.21): the
        Eviction body must name a version the server knows. Asked once (discovery), then remembered."""
        if self._eviction_api_version is None:
            group = await self._call(
                client.PolicyApi(self._api).get_api_group(_request_timeout=self._timeout)
            )
            served = {version.version for version in group.versions or ()}
            self._eviction_api_version = "policy/v1" if "v1" in served else "policy/v1beta1"
        return self._eviction_api_version

    async def dra_version(self) -> str | None:
        """The newest resource.k8s.io version the API server serves (v1 from 1.34, v1beta2 or v1beta1 on
        1.32-1.33), found by discovery and remembered; None where the group is not served (asked again
        next time, as a cluster may be upgraded)."""
        if self._dra_version is None:
            try:
                group = await self._call(
                    client.ResourceApi(self._api).get_api_group(_request_timeout=self._timeout)
                )
            except KubeApiError as error:
                if error.status == HTTP_NOT_FOUND:
                    return None
                raise
            served = {version.version for version in group.versions or ()}
            self._dra_version = next((v for v in DRA_VERSIONS if v in served), None)
        return self._dra_version

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
            await self._call(
                self._core.create_namespaced_pod_eviction(
                    name,
                    namespace,
                    body,
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
            await self._call(
                self._core.delete_namespaced_pod(
                    name, namespace, body=options, _request_timeout=self._timeout
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
            current = await self._call(
                self._core.read_namespaced_resource_quota(
                    QUOTA_NAME, namespace, _request_timeout=self._timeout
                )
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
            await self._call(
                self._core.create_namespaced_resource_quota(namespace, body, _request_timeout=self._timeout)
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
        await self._call(
            self._core.replace_namespaced_resource_quota(
                QUOTA_NAME, namespace, current, _request_timeout=self._timeout
            )
        )
        return QuotaChange.UPDATED

    async def delete_resource_quota(self, namespace: str) -> QuotaChange:
        """Remove our quota from a namespace that no longer has a concurrent limit."""
        try:
            await self._call(
                self._core.delete_namespaced_resource_quota(
                    QUOTA_NAME, namespace, _request_timeout=self._timeout
                )
            )
        except KubeApiError as error:
            if error.status == HTTP_NOT_FOUND:
                return QuotaChange.ABSENT
            raise
        return QuotaChange.DELETED

    async def managed_quota_namespaces(self) -> set[str]:
        """Namespaces holding a quota we manage (to remove the ones whose limit went away)."""
        quotas = await self._call(
            self._core.list_resource_quota_for_all_namespaces(
                label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}", _request_timeout=self._timeout
            )
        )
        return {q.metadata.namespace for q in quotas.items if q.metadata.name == QUOTA_NAME}

    # ---- custom objects (GPUBudget, GPUBudgetDefault) ----------------------------------------------------

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

    async def watch_custom_objects(
        self,
        group: str,
        version: str,
        plural: str,
        timeout_seconds: int = 300,
        backoff: Backoff | None = None,
    ) -> AsyncGenerator[tuple[str, str | None, str], None]:
        """Every change to a custom resource's objects, as (ADDED | MODIFIED | DELETED, namespace, name),
        until the consumer stops: a trigger, not a cache (the consumer lists what is true)."""
        changes = self.watch_custom_raw(group, version, plural, timeout_seconds, backoff)
        async with aclosing(changes):
            async for type_, raw in changes:
                meta = raw.get("metadata") or {}
                yield type_, meta.get("namespace"), str(meta.get("name", ""))

    async def watch_custom_raw(
        self,
        group: str,
        version: str,
        plural: str,
        timeout_seconds: int = 300,
        backoff: Backoff | None = None,
    ) -> AsyncGenerator[tuple[str, JSON], None]:
        """Every change to the objects of a resource served by a group (a custom one, or resource.k8s.io)
        as (ADDED | MODIFIED | DELETED, the object's JSON). Each watch starts where the API server is (an
        ADDED per existing object first) and is opened again when it ends; errors back off."""
        backoff = backoff or Backoff(WATCH_BACKOFF_BASE_SECONDS, WATCH_BACKOFF_CAP_SECONDS)
        while True:
            try:
                async with Watch(return_type="object") as watch:
                    stream = watch.stream(
                        self._custom.list_cluster_custom_object,
                        group,
                        version,
                        plural,
                        timeout_seconds=timeout_seconds,
                        _request_timeout=(self._timeout, timeout_seconds + self._timeout),
                    )
                    async for event in stream:
                        backoff.reset()
                        if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                            yield str(event["type"]), event.get("raw_object") or {}
            except (ApiException, aiohttp.ClientError, TimeoutError, OSError) as exc:
                delay = backoff.next_delay()
                log.warning(
                    "custom_object_watch_failed",
                    extra={"plural": plural, "error": repr(exc), "retry_in_seconds": delay},
                )
                await asyncio.sleep(delay)

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
        if meta.get("namespace"):
            call = self._custom.replace_namespaced_custom_object_status(
                group, version, meta["namespace"], plural, meta["name"], body, _request_timeout=self._timeout
            )
        else:
            call = self._custom.replace_cluster_custom_object_status(
                group, version, plural, meta["name"], body, _request_timeout=self._timeout
            )
        await self._call(call)

    # ---- objects of a group the API server may not serve (Kueue's Workloads) ---------------------------

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
        await self._call(self._core.create_namespaced_event(namespace, body, _request_timeout=self._timeout))


def _same_quantities(current: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """Quantities compare by value: the API server may canonicalise "0.5" to "500m"."""
    if set(current) != set(wanted):
        return False
    return all(parse_quantity(current[k]) == parse_quantity(wanted[k]) for k in wanted)
