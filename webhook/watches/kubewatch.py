"""A view of Kubernetes objects kept current by list and watch (kubernetes_asyncio), and the API client. A
missed event heals within one watch period (a fresh list after each); a 410 re-lists at once; a failure
keeps what the view knew and is retried with backoff."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION
from prometheus_client import Counter

from gpuaccounting.backoff import Backoff
from webhook.settings import WebhookSettings

log = logging.getLogger("webhook.kubewatch")


def _listed(answer: Any) -> tuple[list[Any], str]:
    """A list's items and resourceVersion: a typed answer (V1PriorityClassList) or a plain one (dict)."""
    if isinstance(answer, dict):
        return list(answer.get("items") or []), str((answer.get("metadata") or {}).get("resourceVersion"))
    return list(answer.items), str(answer.metadata.resource_version)


class ListWatch:
    """Keeps one kind's view current: `replace_all` with every listed object, `apply` each event's."""

    def __init__(
        self,
        what: str,
        list_call: Callable[..., Awaitable[Any]],
        replace_all: Callable[[Iterable[Any]], None],
        apply: Callable[[str, Any], None],
        errors: Counter,
        settings: WebhookSettings,
        selector: str | None = None,
    ) -> None:
        self.what = what
        # Passed as an argument, not bound into `list_call`: the watch reads the call's docstring for the
        # type to decode events into.
        self.options: dict[str, Any] = {} if selector is None else {"label_selector": selector}
        self.list_call = list_call
        self.replace_all = replace_all
        self.apply = apply
        self.errors = errors
        self.settings = settings
        cap = settings.kube_retry_max_seconds
        self._backoff = Backoff(min(1.0, cap), cap)
        self._failing = False

    async def list_once(self) -> str:
        """List every object into the view; the list's resourceVersion, to watch from."""
        items, version = _listed(
            await self.list_call(**self.options, _request_timeout=self.settings.kube_request_timeout_seconds)
        )
        self.replace_all(items)
        if self._failing:
            log.info(f"{self.what}_recovered")
        self._failing = False
        self._backoff.reset()
        return version

    async def watch_once(self, resource_version: str) -> None:
        """Apply events until the server ends the watch (after the timeout)."""
        async with watch.Watch() as stream:
            async for event in stream.stream(
                self.list_call,
                **self.options,
                resource_version=resource_version,
                timeout_seconds=self.settings.kube_watch_timeout_seconds,
                allow_watch_bookmarks=True,
                # The server ends the watch; this ends it too should the connection die without a word.
                _request_timeout=self.settings.kube_watch_timeout_seconds
                + self.settings.kube_request_timeout_seconds,
            ):
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    self.apply(event["type"], event["object"])

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
        self.errors.inc()
        if not self._failing:
            log.warning(f"{self.what}_watch_failed", extra={"error": str(error)[:500]})
        self._failing = True
        await asyncio.sleep(self._backoff.next_delay())


def _kubeconfig(settings: WebhookSettings) -> Path | None:
    """The kubeconfig file to load; None in a cluster with no file configured (the pod's ServiceAccount)."""
    if settings.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    path = settings.kubeconfig or Path(KUBE_CONFIG_DEFAULT_LOCATION).expanduser()
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
            # re-reads rotated tokens; kubernetes_asyncio leaves this one function unannotated
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await config.load_kube_config(
                config_file=str(path), client_configuration=configuration, persist_config=False
            )
    except config.ConfigException as error:
        raise config.ConfigException(
            f"cannot reach the Kubernetes API to watch PriorityClasses and DRA claims ({error}): run in a"
            " cluster, set WEBHOOK_KUBECONFIG, or set WEBHOOK_WATCH_PRIORITY_CLASSES=false"
        ) from error
    return client.ApiClient(configuration)
