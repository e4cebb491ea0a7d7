"""The one place the timekeeper talks to the Kubernetes API.

`KubeClient` wraps the (synchronous) `kubernetes` client behind typed methods, so the rest of the timekeeper
never sees client models or `ApiException`s: callers in async code run these methods through
`asyncio.to_thread`, and the pod watch runs in a thread of its own. Pods are read as raw JSON rather than
deserialised into client models, which is both faster (a large cluster lists 100,000 pods) and what the share
computation takes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import kubernetes
import urllib3
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException
from kubernetes.utils.quantity import parse_quantity
from kubernetes.watch.watch import iter_resp_lines

from gpuaccounting.names import DOMAIN
from timekeeper.kube.types import (
    JSON,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    EvictionResult,
    KubeError,
    KubeUnavailableError,
    ObjectReference,
    PodEvent,
    PodInfo,
    PodSnapshot,
    QuotaChange,
    TokenReviewResult,
)
from timekeeper.settings import Settings

log = logging.getLogger(__name__)

COMPONENT = "gpu-timekeeper"
QUOTA_NAME = "gpu-timekeeper"
HTTP_GONE = 410
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
HTTP_TOO_MANY_REQUESTS = 429


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """Where the cluster is: in-cluster service account, else a kubeconfig (the default one when unset)."""

    in_cluster: bool | None = None  # None: in-cluster when KUBERNETES_SERVICE_HOST is set
    kubeconfig: Path | None = None
    context: str | None = None
    request_timeout_seconds: float = 10.0

    @classmethod
    def from_settings(cls, settings: Settings) -> KubeConfig:
        return cls(
            settings.kube_in_cluster,
            settings.kubeconfig,
            settings.kube_context,
            settings.kube_request_timeout_seconds,
        )


def load_configuration(config: KubeConfig) -> Configuration:
    """A client Configuration for the cluster, without touching the client's process-wide default."""
    configuration = Configuration()
    in_cluster = config.in_cluster
    if in_cluster is None:
        in_cluster = "KUBERNETES_SERVICE_HOST" in os.environ
    if in_cluster:
        # Re-reads the rotating projected token before it expires.
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    else:
        kubernetes.config.load_kube_config(
            config_file=str(config.kubeconfig) if config.kubeconfig else None,
            context=config.context,
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
        has_controller=any(ref.get("controller") for ref in meta.get("ownerReferences") or []),
        raw=raw,
    )


class Backoff:
    """Exponential backoff with full jitter, so many replicas do not retry in lockstep."""

    def __init__(self, initial: float = 0.5, maximum: float = 30.0) -> None:
        self.initial, self.maximum, self._attempt = initial, maximum, 0

    def next_delay(self) -> float:
        delay = min(self.maximum, self.initial * 2**self._attempt)
        self._attempt += 1
        return random.uniform(delay / 2, delay)

    def reset(self) -> None:
        self._attempt = 0


class _Gone(Exception):
    """The watch's resourceVersion is too old (410 Gone / Expired): list again."""


class KubeClient:
    """Typed access to the few Kubernetes APIs the timekeeper uses. Thread-safe; blocking."""

    def __init__(self, configuration: Configuration, request_timeout_seconds: float = 10.0) -> None:
        self._api = ApiClient(configuration)
        self._core = kubernetes.client.CoreV1Api(self._api)
        self._authn = kubernetes.client.AuthenticationV1Api(self._api)
        self._authz = kubernetes.client.AuthorizationV1Api(self._api)
        self._timeout = request_timeout_seconds
        self._instance = os.environ.get("HOSTNAME", COMPONENT)
        self._watches: set[urllib3.BaseHTTPResponse] = set()
        self._watches_lock = threading.Lock()
        self._closed = False
        self._eviction_api_version: str | None = None

    @classmethod
    def from_config(cls, config: KubeConfig) -> KubeClient:
        return cls(load_configuration(config), config.request_timeout_seconds)

    def close(self) -> None:
        """Close the connections, ending open watches at once (their threads see the stream end)."""
        with self._watches_lock:
            self._closed = True
        self.end_watches()
        self._api.close()

    def end_watches(self) -> None:
        """End the open watches at once, keeping the client usable: a watcher that set its `stop` first
        sees its stream end (or, for a request still on its way, the stop) and returns."""
        with self._watches_lock:
            watches = list(self._watches)
        for response in watches:
            with contextlib.suppress(ValueError, OSError):
                response.shutdown()

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call the client, turning transport failures and 5xx into KubeUnavailableError."""
        try:
            return fn(*args, _request_timeout=self._timeout, **kwargs)
        except ApiException as exc:
            if exc.status is None or exc.status >= 500:
                raise KubeUnavailableError(f"kubernetes API error {exc.status}: {exc.reason}") from exc
            raise
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeUnavailableError(f"kubernetes API unreachable: {exc}") from exc

    # ---- authentication and authorisation --------------------------------------------------------------

    def token_review(self, token: str, audiences: tuple[str, ...]) -> TokenReviewResult:
        """Ask the API server who a bearer token stands for (and whether it is meant for `audiences`)."""
        body = kubernetes.client.V1TokenReview(
            spec=kubernetes.client.V1TokenReviewSpec(token=token, audiences=list(audiences))
        )
        try:
            review = self._call(self._authn.create_token_review, body)
        except ApiException as exc:
            raise KubeError(f"TokenReview refused: {exc.status} {exc.reason}") from exc
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

    def subject_access_review(
        self,
        user: str,
        groups: tuple[str, ...],
        verb: str,
        resource: str,
        group: str,
        namespace: str | None,
    ) -> bool:
        """Whether RBAC (or any authorizer) lets the user perform the verb on the resource."""
        attributes = kubernetes.client.V1ResourceAttributes(
            verb=verb, resource=resource, group=group, namespace=namespace or ""
        )
        body = kubernetes.client.V1SubjectAccessReview(
            spec=kubernetes.client.V1SubjectAccessReviewSpec(
                user=user, groups=list(groups), resource_attributes=attributes
            )
        )
        try:
            review = self._call(self._authz.create_subject_access_review, body)
        except ApiException as exc:
            raise KubeError(f"SubjectAccessReview refused: {exc.status} {exc.reason}") from exc
        return bool(review.status and review.status.allowed and not review.status.denied)

    # ---- pods ------------------------------------------------------------------------------------------

    def list_pods(self, label_selector: str | None = None, page_size: int = 500) -> PodSnapshot:
        """Every pod (in pages), with the resourceVersion to watch from."""
        pods: list[PodInfo] = []
        token: str | None = None
        resource_version = ""
        while True:
            kwargs: dict[str, Any] = {"limit": page_size, "_preload_content": False}
            if token:
                kwargs["_continue"] = token
            if label_selector:
                kwargs["label_selector"] = label_selector
            response = self._call(self._core.list_pod_for_all_namespaces, **kwargs)
            page = json.loads(response.data)
            meta = page.get("metadata") or {}
            resource_version = resource_version or meta.get("resourceVersion", "")
            pods.extend(pod_info(item) for item in page.get("items") or [])
            token = meta.get("continue")
            if not token:
                return PodSnapshot(tuple(pods), resource_version)

    def watch_pods(
        self,
        stop: threading.Event,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
        backoff: Backoff | None = None,
    ) -> Iterator[PodSnapshot | PodEvent]:
        """A snapshot, then every change, forever (until `stop`): list, watch from its resourceVersion,
        resume each watch from the last event seen, list again when that is too old (410), back off on
        errors. A consumer treats each snapshot as the full truth (pods missing from it are gone)."""
        backoff = backoff or Backoff()
        resource_version: str | None = None
        while not stop.is_set():
            try:
                if resource_version is None:
                    snapshot = self.list_pods(label_selector)
                    resource_version = snapshot.resource_version
                    yield snapshot
                for item in self._watch_once(resource_version, label_selector, timeout_seconds, stop):
                    if isinstance(item, str):
                        resource_version = item
                        continue
                    resource_version = item.pod.resource_version or resource_version
                    yield item
                backoff.reset()
            except _Gone:
                log.info("pod_watch_expired", extra={"resource_version": resource_version})
                resource_version = None
            except (KubeError, ApiException) as exc:
                if isinstance(exc, ApiException) and exc.status == HTTP_GONE:
                    resource_version = None
                    continue
                if stop.is_set():  # its stream was ended on purpose (end_watches)
                    return
                delay = backoff.next_delay()
                log.warning("pod_watch_failed", extra={"error": str(exc), "retry_in_seconds": delay})
                stop.wait(delay)

    def _watch_once(
        self, resource_version: str, label_selector: str | None, timeout_seconds: int, stop: threading.Event
    ) -> Iterator[PodEvent | str]:
        """One watch request: pod events, and bare resourceVersions from bookmarks."""
        kwargs: dict[str, Any] = {
            "watch": True,
            "resource_version": resource_version,
            "timeout_seconds": timeout_seconds,
            "allow_watch_bookmarks": True,
            "_preload_content": False,
        }
        if label_selector:
            kwargs["label_selector"] = label_selector
        try:
            response = self._core.list_pod_for_all_namespaces(
                **kwargs, _request_timeout=(self._timeout, timeout_seconds + self._timeout)
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeUnavailableError(f"kubernetes API unreachable: {exc}") from exc
        with self._watches_lock:
            closing = self._closed
            self._watches.add(response)
        try:
            if closing or stop.is_set():  # closed or stopped while this request was on its way
                return
            for line in iter_resp_lines(response):
                if stop.is_set():
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    if obj.get("code") == HTTP_GONE:
                        raise _Gone
                    raise KubeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                if kind == "BOOKMARK":
                    yield obj["metadata"]["resourceVersion"]
                    continue
                yield PodEvent(kind, pod_info(obj))
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeUnavailableError(f"pod watch interrupted: {exc}") from exc
        finally:
            with self._watches_lock:
                self._watches.discard(response)
            response.close()
            response.release_conn()

    def eviction_api_version(self) -> str:
        """`policy/v1` where the API server serves it (1.22 on), else `policy/v1beta1` (1.20, 1.21): the
        Eviction body must name a version the server knows. Asked once (discovery), then remembered."""
        if self._eviction_api_version is None:
            try:
                group = self._call(kubernetes.client.PolicyApi(self._api).get_api_group)
            except ApiException as exc:
                raise KubeError(f"discovery of the policy API group: {exc.status} {exc.reason}") from exc
            served = {version.version for version in group.versions or ()}
            self._eviction_api_version = "policy/v1" if "v1" in served else "policy/v1beta1"
        return self._eviction_api_version

    def evict_pod(self, namespace: str, name: str) -> EvictionResult:
        """Evict through the Eviction API, so PodDisruptionBudgets are honoured."""
        body = {
            "apiVersion": self.eviction_api_version(),
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        try:
            self._call(self._core.create_namespaced_pod_eviction, name, namespace, body)
        except ApiException as exc:
            if exc.status == HTTP_TOO_MANY_REQUESTS:
                return EvictionResult.BLOCKED_BY_PDB
            if exc.status == HTTP_NOT_FOUND:
                return EvictionResult.GONE
            raise KubeError(f"eviction of {namespace}/{name} refused: {exc.status} {exc.reason}") from exc
        return EvictionResult.EVICTED

    # ---- quotas ----------------------------------------------------------------------------------------

    def apply_resource_quota(self, namespace: str, hard: Mapping[str, str]) -> QuotaChange:
        """Make the namespace's `gpu-timekeeper` ResourceQuota say exactly `hard`, correcting any drift."""
        for _ in range(3):
            try:
                return self._apply_resource_quota_once(namespace, hard)
            except ApiException as exc:
                if exc.status != HTTP_CONFLICT:
                    raise KubeError(f"quota in {namespace}: {exc.status} {exc.reason}") from exc
                # Someone changed it (or created it) between our read and write: read again.
        raise KubeError(f"quota in {namespace}: kept conflicting")

    def _apply_resource_quota_once(self, namespace: str, hard: Mapping[str, str]) -> QuotaChange:
        labels = {MANAGED_BY_LABEL: MANAGED_BY}
        annotations = {f"{DOMAIN}/managed": "true"}
        try:
            current = self._call(self._core.read_namespaced_resource_quota, QUOTA_NAME, namespace)
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise
            body = kubernetes.client.V1ResourceQuota(
                metadata=kubernetes.client.V1ObjectMeta(
                    name=QUOTA_NAME, namespace=namespace, labels=labels, annotations=annotations
                ),
                spec=kubernetes.client.V1ResourceQuotaSpec(hard=dict(hard)),
            )
            self._call(self._core.create_namespaced_resource_quota, namespace, body)
            return QuotaChange.CREATED
        current_labels = current.metadata.labels or {}
        current_hard = (current.spec.hard if current.spec else None) or {}
        if _same_quantities(current_hard, hard) and all(
            current_labels.get(k) == v for k, v in labels.items()
        ):
            return QuotaChange.UNCHANGED
        current.metadata.labels = {**current_labels, **labels}
        current.metadata.annotations = {**(current.metadata.annotations or {}), **annotations}
        current.spec = kubernetes.client.V1ResourceQuotaSpec(hard=dict(hard))
        # Carries the resourceVersion we read: a concurrent change answers 409 and we go round again.
        self._call(self._core.replace_namespaced_resource_quota, QUOTA_NAME, namespace, current)
        return QuotaChange.UPDATED

    def delete_resource_quota(self, namespace: str) -> QuotaChange:
        """Remove our quota from a namespace that no longer has a concurrent limit."""
        try:
            self._call(self._core.delete_namespaced_resource_quota, QUOTA_NAME, namespace)
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                return QuotaChange.ABSENT
            raise KubeError(f"quota in {namespace}: {exc.status} {exc.reason}") from exc
        return QuotaChange.DELETED

    def managed_quota_namespaces(self) -> set[str]:
        """Namespaces holding a quota we manage (to remove the ones whose limit went away)."""
        quotas = self._call(
            self._core.list_resource_quota_for_all_namespaces,
            label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}",
        )
        return {q.metadata.namespace for q in quotas.items if q.metadata.name == QUOTA_NAME}

    # ---- events ----------------------------------------------------------------------------------------

    def post_event(
        self,
        namespace: str,
        reason: str,
        message: str,
        type_: str = "Normal",
        involved: ObjectReference | None = None,
    ) -> None:
        """Record a Kubernetes Event (`kubectl describe namespace` shows it) about the namespace or a pod."""
        involved = involved or ObjectReference(kind="Namespace", name=namespace)
        now = datetime.now(UTC)
        body = kubernetes.client.CoreV1Event(
            metadata=kubernetes.client.V1ObjectMeta(
                name=f"{involved.name}.{int(now.timestamp() * 1e9):x}", namespace=namespace
            ),
            involved_object=kubernetes.client.V1ObjectReference(
                api_version=involved.api_version,
                kind=involved.kind,
                name=involved.name,
                namespace=involved.namespace or (namespace if involved.kind != "Namespace" else None),
                uid=involved.uid,
            ),
            reason=reason,
            message=message[:1024],
            type=type_,
            source=kubernetes.client.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            reporting_instance=self._instance,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            self._call(self._core.create_namespaced_event, namespace, body)
        except ApiException as exc:
            raise KubeError(f"event in {namespace}: {exc.status} {exc.reason}") from exc


def _same_quantities(current: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """Quantities compare by value: the API server may canonicalise "0.5" to "500m"."""
    if set(current) != set(wanted):
        return False
    return all(Decimal(parse_quantity(current[k])) == Decimal(parse_quantity(wanted[k])) for k in wanted)
