"""The Kubernetes boundary's watches: pods (list, then watch from the list's resourceVersion, resumed
and listed again as needed) and the objects of a group (a custom one, or resource.k8s.io)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from gpuaccounting.backoff import Backoff
from timekeeper.kube.core import HTTP_GONE, TRANSPORT_ERRORS, api_error
from timekeeper.kube.reads import KubeReads
from timekeeper.kube.types import JSON, KubeError, KubeUnavailableError, PodEvent, PodSnapshot, pod_info

log = logging.getLogger(__name__)

# How the pod watch retries after an error: from half a second, doubling, to at most 30 s apart.
WATCH_BACKOFF_BASE_SECONDS = 0.5
WATCH_BACKOFF_CAP_SECONDS = 30.0


class _Gone(Exception):
    """The watch's resourceVersion is too old (410 Gone / Expired): list again."""


class KubeWatches(KubeReads):
    """Watches, each starting from a list (its reads)."""

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
            raise api_error(exc) from exc
        except TRANSPORT_ERRORS as exc:
            raise KubeUnavailableError(f"pod watch interrupted: {exc!r}") from exc

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
            except (ApiException, *TRANSPORT_ERRORS) as exc:
                delay = backoff.next_delay()
                log.warning(
                    "custom_object_watch_failed",
                    extra={"plural": plural, "error": repr(exc), "retry_in_seconds": delay},
                )
                await asyncio.sleep(delay)
