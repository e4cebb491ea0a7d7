"""The cluster's PriorityClasses, listed and watched through the Kubernetes API (kubernetes_asyncio).

The webhook needs them for two things the pod alone cannot say: whether the class a pod arrived with was
filled in by the Priority plugin from the `globalDefault` class (so no class was chosen) or named by its
user, and each class's real `value` and `preemptionPolicy` (so the numbers written beside our classes are
the objects' own, and a user class can be compared with the ceiling). A list, then a watch from its
resourceVersion that ends after `kube_watch_timeout_seconds`, then a fresh list: a missed event is healed
within one watch period, and an expired resourceVersion (410) re-lists at once. Needs get/list/watch on
priorityclasses.scheduling.k8s.io (deployment/base/rbac/webhook.yaml).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from gpuaccounting.backoff import Backoff
from webhook.metrics import WebhookMetrics
from webhook.settings import WebhookSettings

log = logging.getLogger("webhook.priorityclasses")

DEFAULT_PREEMPTION_POLICY = "PreemptLowerPriority"  # what the API server defaults an unset field to


@dataclass(frozen=True, slots=True)
class PriorityClassInfo:
    name: str
    value: int
    preemption_policy: str
    global_default: bool

    @classmethod
    def from_object(cls, obj: client.V1PriorityClass) -> PriorityClassInfo:
        return cls(
            name=obj.metadata.name,
            value=int(obj.value),
            preemption_policy=obj.preemption_policy or DEFAULT_PREEMPTION_POLICY,
            global_default=bool(obj.global_default),
        )


class PriorityClassCatalog:
    """The classes as last listed and watched; empty and not `loaded` until the first list."""

    def __init__(self) -> None:
        self._classes: dict[str, PriorityClassInfo] = {}
        self.loaded = False

    def replace_all(self, classes: Iterable[PriorityClassInfo]) -> None:
        self._classes = {info.name: info for info in classes}
        self.loaded = True

    def put(self, info: PriorityClassInfo) -> None:
        self._classes[info.name] = info

    def remove(self, name: str) -> None:
        self._classes.pop(name, None)

    def get(self, name: str) -> PriorityClassInfo | None:
        return self._classes.get(name)

    def is_global_default(self, name: str) -> bool:
        info = self._classes.get(name)
        return info is not None and info.global_default

    def known(self) -> int:
        """How many classes are known; -1 before the first list (the metric's value)."""
        return len(self._classes) if self.loaded else -1


class PriorityClassWatcher:
    """Keeps a catalog current; a failure keeps what it knew, is counted, and is logged once per outage."""

    def __init__(
        self,
        api: client.SchedulingV1Api,
        catalog: PriorityClassCatalog,
        metrics: WebhookMetrics,
        settings: WebhookSettings,
    ) -> None:
        self.api = api
        self.catalog = catalog
        self.metrics = metrics
        self.settings = settings
        cap = settings.kube_retry_max_seconds
        self._backoff = Backoff(min(1.0, cap), cap)
        self._failing = False

    async def list_once(self) -> str:
        """List every class into the catalog; the list's resourceVersion, to watch from."""
        listed = await self.api.list_priority_class(
            _request_timeout=self.settings.kube_request_timeout_seconds
        )
        self.catalog.replace_all(PriorityClassInfo.from_object(item) for item in listed.items)
        if self._failing:
            log.info("priority_classes_recovered", extra={"classes": self.catalog.known()})
        self._failing = False
        self._backoff.reset()
        return str(listed.metadata.resource_version)

    def apply(self, event: dict[str, Any]) -> None:
        info = PriorityClassInfo.from_object(event["object"])
        if event["type"] == "DELETED":
            self.catalog.remove(info.name)
        elif event["type"] in ("ADDED", "MODIFIED"):
            self.catalog.put(info)

    async def watch_once(self, resource_version: str) -> None:
        """Apply events until the server ends the watch (after the timeout)."""
        async with watch.Watch() as stream:
            async for event in stream.stream(
                self.api.list_priority_class,
                resource_version=resource_version,
                timeout_seconds=self.settings.kube_watch_timeout_seconds,
                allow_watch_bookmarks=True,
                # The server ends the watch; this ends it too should the connection die without a word.
                _request_timeout=self.settings.kube_watch_timeout_seconds
                + self.settings.kube_request_timeout_seconds,
            ):
                self.apply(event)

    async def run(self) -> None:
        while True:
            try:
                await self.watch_once(await self.list_once())
            except ApiException as error:
                if error.status == 410:  # the watch's resourceVersion expired: list afresh, now
                    continue
                await self._failed(error)
            # Anything else the client raises (connection refused, TLS, a timeout, a garbled event): this
            # loop is the one place that keeps the view current, so it must outlive every failure.
            except Exception as error:
                await self._failed(error)

    async def _failed(self, error: BaseException) -> None:
        self.metrics.priority_class_watch_errors.inc()
        if not self._failing:
            log.warning("priority_classes_watch_failed", extra={"error": str(error)[:500]})
        self._failing = True
        await asyncio.sleep(self._backoff.next_delay())


def _kubeconfig(settings: WebhookSettings) -> Path | None:
    """The kubeconfig file to load; None in a cluster with no file configured (the pod's ServiceAccount)."""
    if settings.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    path = settings.kubeconfig or Path(config.KUBE_CONFIG_DEFAULT_LOCATION).expanduser()
    if not path.is_file():
        raise config.ConfigException(f"no kubeconfig at {path}")
    return path


async def api_client(settings: WebhookSettings) -> client.ApiClient:
    """A client for the configured cluster: `kubeconfig`, else the pod's ServiceAccount in a cluster,
    else the default kubeconfig file. A configuration that cannot be loaded stops the webhook at start."""
    configuration = client.Configuration()
    try:
        path = _kubeconfig(settings)
        if path is None:
            config.load_incluster_config(client_configuration=configuration)  # re-reads rotated tokens
        else:
            await config.load_kube_config(
                config_file=str(path), client_configuration=configuration, persist_config=False
            )
    except config.ConfigException as error:
        raise config.ConfigException(
            f"cannot reach the Kubernetes API to watch PriorityClasses ({error}): run in a cluster, set "
            "WEBHOOK_KUBECONFIG, or set WEBHOOK_WATCH_PRIORITY_CLASSES=false"
        ) from error
    return client.ApiClient(configuration)


@contextlib.asynccontextmanager
async def priority_class_watch(
    settings: WebhookSettings, catalog: PriorityClassCatalog, metrics: WebhookMetrics
) -> AsyncIterator[None]:
    """Keep `catalog` current while the app runs (nothing when `watch_priority_classes` is off)."""
    if not settings.watch_priority_classes:
        yield
        return
    async with await api_client(settings) as kube:
        watcher = PriorityClassWatcher(client.SchedulingV1Api(kube), catalog, metrics, settings)
        task = asyncio.create_task(watcher.run(), name="priority-class-watch")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
