"""The namespaces' budget state, cached in memory: admission only reads it; the poller alone waits on the
network, sending `If-None-Match` so an unchanged snapshot costs a 304."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, cast, get_args, get_origin, get_type_hints, is_typeddict

import httpx
from pydantic import BaseModel, create_model

from gpuaccounting.admission_state import AdmissionSnapshot, NamespaceAdmission, resolve
from gpuaccounting.backoff import Backoff
from gpuaccounting.counters import start_at_zero
from gpuaccounting.names import ADMISSION_STATE_PATH, CLUSTER_HEADER
from webhook.metrics import WebhookMetrics
from webhook.settings import WebhookSettings

log = logging.getLogger("webhook.state")

Freshness = Literal["fresh", "stale", "missing"]


@dataclass(frozen=True, slots=True)
class NamespaceView:
    """What the cache knows about one namespace, and how much to trust it."""

    admission: NamespaceAdmission | None
    freshness: Freshness
    age_seconds: float | None


class BudgetStateCache:
    """The last snapshot, resolved per namespace when it is stored, and when it was last confirmed (a
    200 or a 304)."""

    def __init__(self, max_age_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_seconds = max_age_seconds
        self._clock = clock
        self.snapshot: AdmissionSnapshot | None = None
        self.etag: str | None = None
        self.confirmed_at: float | None = None
        self._resolved: tuple[NamespaceAdmission, dict[str, NamespaceAdmission]] | None = None

    def store(self, snapshot: AdmissionSnapshot, etag: str | None) -> None:
        """Keep a snapshot (ValueError, and the last one kept, when an entry names no policy)."""
        self._resolved = resolve(snapshot)
        self.snapshot = snapshot
        self.etag = etag
        self.confirmed_at = self._clock()

    def confirm(self) -> None:
        self.confirmed_at = self._clock()

    def age_seconds(self) -> float | None:
        return None if self.confirmed_at is None else self._clock() - self.confirmed_at

    def view(self, namespace: str) -> NamespaceView:
        """A namespace the snapshot leaves out is governed by its default (admission_state.py)."""
        resolved = self._resolved
        if resolved is None:
            return NamespaceView(None, "missing", None)
        age = self.age_seconds() or 0.0
        default, namespaces = resolved
        admission = namespaces.get(namespace) or default
        return NamespaceView(admission, "stale" if age > self.max_age_seconds else "fresh", age)


PollResult = Literal["updated", "not_modified", "error"]
STATE_POLL_RETRY_BASE_SECONDS = 1.0


def _model_of(typed: Any) -> type[BaseModel]:
    """The pydantic model of a gpuaccounting TypedDict, field for field (pydantic takes no typing.TypedDict
    on Python 3.11, and gpuaccounting imports nothing): the snapshot's schema stays written once."""
    fields: dict[str, Any] = {}
    for name, hint in get_type_hints(typed, include_extras=True).items():
        if get_origin(hint) is NotRequired:  # absent from an older timekeeper's snapshot: left unset
            fields[name] = (_field_type(get_args(hint)[0]), None)
        else:
            fields[name] = (_field_type(hint), ...)
    return create_model(typed.__name__, **fields)


def _field_type(hint: Any) -> Any:
    if is_typeddict(hint):
        return _model_of(hint)
    if get_origin(hint) in (list, dict):
        return get_origin(hint)[tuple(_field_type(arg) for arg in get_args(hint))]
    return hint


# Validated strictly (an index is never a string or a float that happens to convert) and checked against
# its policies by `resolve`.
_SNAPSHOT = _model_of(AdmissionSnapshot)


class BudgetStatePoller:
    """Polls `GET /api/v1/admission-state`; a failure keeps the last snapshot and is counted and logged."""

    def __init__(
        self,
        settings: WebhookSettings,
        cache: BudgetStateCache,
        metrics: WebhookMetrics,
        client: httpx.AsyncClient,
        backoff: Backoff | None = None,
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.metrics = metrics
        self.client = client
        self.url = settings.timekeeper_url.rstrip("/") + ADMISSION_STATE_PATH
        self._failing = False
        start_at_zero(metrics.state_polls, result=get_args(PollResult))
        cap = settings.state_poll_retry_max_seconds
        base = min(STATE_POLL_RETRY_BASE_SECONDS, settings.state_poll_interval_seconds, cap)
        self._backoff = backoff or Backoff(base, cap)

    async def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.settings.cluster:  # a fleet's member: our token is reviewed, our namespaces answered, there
            headers[CLUSTER_HEADER] = self.settings.cluster
        if self.cache.etag:
            headers["If-None-Match"] = self.cache.etag
        token_file = self.settings.timekeeper_token_file
        if token_file is not None:
            token = (await asyncio.to_thread(token_file.read_text)).strip()
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def poll_once(self) -> PollResult:
        try:
            response = await self.client.get(
                self.url, headers=await self._headers(), timeout=self.settings.state_poll_timeout_seconds
            )
            if response.status_code == 304:
                self.cache.confirm()
                result: PollResult = "not_modified"
            else:
                response.raise_for_status()
                snapshot = cast(
                    AdmissionSnapshot,
                    _SNAPSHOT.model_validate_json(response.content, strict=True).model_dump(
                        exclude_unset=True
                    ),
                )
                self.cache.store(snapshot, response.headers.get("etag"))
                self.metrics.state_version.set(snapshot["version"])
                result = "updated"
        # ValueError: a token file that is not text, a snapshot that is not the format (ValidationError)
        # or names a policy it does not list.
        except (httpx.HTTPError, OSError, ValueError) as error:
            self.metrics.state_polls.labels(result="error").inc()
            if not self._failing:  # log the first failure of a run of failures, not every poll
                log.warning("admission_state_poll_failed", extra={"url": self.url, "error": str(error)[:500]})
            self._failing = True
            return "error"
        if self._failing:
            log.info("admission_state_poll_recovered", extra={"url": self.url})
        self._failing = False
        self.metrics.state_polls.labels(result=result).inc()
        return result

    def next_wait(self, result: PollResult) -> float:
        """The interval after an answer; after a failure, the backoff: a blip is retried soon, a long
        outage at most every `state_poll_retry_max_seconds`, and replicas that failed together spread out
        instead of polling a recovering timekeeper in step."""
        if result == "error":
            return self._backoff.next_delay()
        self._backoff.reset()
        return self.settings.state_poll_interval_seconds

    async def run(self) -> None:
        while True:
            result = await self.poll_once()
            await asyncio.sleep(self.next_wait(result))
