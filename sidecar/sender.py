"""Delivery of buffered reports on a thread of its own: one POST per report, the token read fresh each time.
2xx is acknowledged; 401, 403, 408, 429, 5xx and network errors are retried (`gpuaccounting.backoff`); any
other 4xx is sent once more as allocation only, then dropped, counted and logged."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

from gpuaccounting.backoff import Backoff
from gpuaccounting.names import CLUSTER_HEADER, REPORTS_PATH
from gpuaccounting.wire import Report, ReportAck
from sidecar.buffer import Pending, ReportBuffer
from sidecar.logs import EventLog

if TYPE_CHECKING:
    import http.client

RETRYABLE_4XX = frozenset({401, 403, 408, 429})
# Backoff while draining at shutdown: the grace period is short, so retry often rather than wait long.
DRAIN_RETRY_CAP_SECONDS = 1.0


class Outcome(Enum):
    ACKNOWLEDGED = "acknowledged"
    RETRY = "retry"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class SendResult:
    outcome: Outcome
    detail: str
    ack: ReportAck | None = None
    retry_after: float | None = None


def classify(status: int) -> Outcome:
    """What an HTTP status means for a report."""
    if 200 <= status < 300:
        return Outcome.ACKNOWLEDGED
    if status in RETRYABLE_4XX or status >= 500 or status < 200:
        return Outcome.RETRY
    return Outcome.REJECTED


def load_http_client(https: bool) -> ModuleType:
    """http.client, without OpenSSL when the timekeeper is plain http:// (an in-cluster Service): ssl is
    hidden during the import, saving its RSS (bench/RESULTS.md, "Profiles measured by hand")."""
    if https or "http.client" in sys.modules or "ssl" in sys.modules:
        import http.client

        return http.client
    sys.modules["ssl"] = None  # type: ignore[assignment]
    try:
        import http.client

        return http.client
    finally:
        del sys.modules["ssl"]


class TimekeeperClient:
    """POSTs one report; never raises for network or HTTP trouble, answers a SendResult instead."""

    def __init__(self, base_url: str, token_file: Path, timeout: float, cluster: str | None = None) -> None:
        parts = urlsplit(base_url)
        self._https = parts.scheme == "https"
        self._http = load_http_client(self._https)
        self._host = parts.hostname or "localhost"
        self._port = parts.port
        self._path = parts.path.rstrip("/") + REPORTS_PATH
        self._token_file = token_file
        self._timeout = timeout
        # A fleet's member: the hub reviews our token with that cluster's API server (docs/fleet.md).
        self._cluster_headers = {CLUSTER_HEADER: cluster} if cluster else {}

    def _connection(self) -> http.client.HTTPConnection:
        if self._https:
            return cast(
                "http.client.HTTPConnection",
                self._http.HTTPSConnection(self._host, self._port, timeout=self._timeout),
            )
        return cast(
            "http.client.HTTPConnection",
            self._http.HTTPConnection(self._host, self._port, timeout=self._timeout),
        )

    def send(self, report: Report) -> SendResult:
        try:
            token = self._token_file.read_text(encoding="utf-8").strip()
        except OSError as error:
            return SendResult(Outcome.RETRY, f"token file unreadable: {error.strerror or error}")
        if not token:
            return SendResult(Outcome.RETRY, "token file is empty")
        body = json.dumps(report, separators=(",", ":")).encode()
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "Authorization": f"Bearer {token}",
            **self._cluster_headers,
        }
        connection = self._connection()
        try:
            connection.request("POST", self._path, body=body, headers=headers)
            response = connection.getresponse()
            payload = response.read()
            status = response.status
            retry_after = response.getheader("Retry-After")
        except (OSError, self._http.HTTPException) as error:
            return SendResult(Outcome.RETRY, f"{type(error).__name__}: {error}")
        finally:
            connection.close()
        outcome = classify(status)
        detail = f"HTTP {status}: {payload[:300].decode('utf-8', 'replace')}"
        if outcome is not Outcome.ACKNOWLEDGED:
            seconds = float(retry_after) if retry_after and retry_after.isdigit() else None
            return SendResult(outcome, detail, retry_after=seconds)
        try:
            ack = cast(ReportAck, json.loads(payload))
        except ValueError:
            ack = None
        return SendResult(Outcome.ACKNOWLEDGED, f"HTTP {status}", ack=ack)


class Sender:
    """Drains the buffer oldest-first; `wake()` after admitting a report, `drain()` at shutdown."""

    def __init__(
        self,
        buffer: ReportBuffer,
        client: TimekeeperClient,
        *,
        retry_base: float,
        retry_max: float,
        record_drop: Callable[[float], tuple[int, float]],
        log: EventLog,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._buffer = buffer
        self._client = client
        self._retry_base = retry_base
        self._retry_max = retry_max
        self._backoff = Backoff(retry_base, retry_max)
        self._record_drop = record_drop
        self._log = log
        self._clock = clock
        self._wakeup = threading.Event()
        self._stop = threading.Event()
        self._draining = False
        self._failing_since: float | None = None
        self._acknowledged = 0
        self._thread = threading.Thread(target=self._run, name="sidecar-sender", daemon=True)

    @property
    def acknowledged(self) -> int:
        return self._acknowledged

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wakeup.set()

    def drain(self, timeout: float) -> bool:
        """Send what is pending for at most `timeout` seconds, then stop; answers whether all went."""
        self._draining = True
        cap = min(self._retry_max, DRAIN_RETRY_CAP_SECONDS)
        self._backoff = Backoff(min(self._retry_base, cap), cap)
        self._wakeup.set()
        deadline = self._clock() + timeout
        while len(self._buffer) and self._clock() < deadline:
            time.sleep(0.02)
        self._stop.set()
        self._wakeup.set()
        self._thread.join(timeout=max(0.0, deadline - self._clock()) + 0.5)
        return len(self._buffer) == 0

    def _run(self) -> None:
        while not self._stop.is_set():
            pending = self._buffer.oldest()
            if pending is None:
                self._wakeup.wait()
                self._wakeup.clear()
                continue
            delay = self._deliver(pending)
            if delay > 0:
                self._wakeup.wait(delay)
                self._wakeup.clear()

    def _deliver(self, pending: Pending) -> float:
        """Try one report; answers how long to wait before the next attempt (0: go on at once)."""
        report = self._buffer.read(pending)
        if report is None:
            self._give_up(pending, "buffered file unreadable")
            return 0.0
        result = self._client.send(report)
        if result.outcome is Outcome.REJECTED and report["gpus"]:
            # The body is what the timekeeper refuses; the charge needs only share and time.
            self._log.warning(
                "report_rejected_retrying_without_figures", seq=report["seq"], detail=result.detail
            )
            stripped = cast(Report, {**report, "gpus": []})
            replaced = self._buffer.replace(pending, stripped)
            if replaced is None:
                return 0.0
            pending = replaced
            result = self._client.send(stripped)
        if result.outcome is Outcome.ACKNOWLEDGED:
            self._on_acknowledged(pending, result)
            return 0.0
        if result.outcome is Outcome.REJECTED:
            self._give_up(pending, result.detail)
            return 0.0
        return self._on_retry(result)

    def _on_acknowledged(self, pending: Pending, result: SendResult) -> None:
        self._buffer.remove(pending)
        self._acknowledged += 1
        ack: dict[str, object] = dict(result.ack or {})
        if self._failing_since is not None:
            self._log.info(
                "timekeeper_reachable",
                outage_seconds=round(self._clock() - self._failing_since, 1),
                pending=len(self._buffer),
            )
            self._failing_since = None
        elif self._acknowledged == 1:
            self._log.info("first_report_acknowledged", seq=pending.seq, state=ack.get("state"))
        self._log.debug(
            "report_acknowledged",
            seq=pending.seq,
            duplicate=ack.get("duplicate"),
            gpu_minutes=ack.get("gpu_minutes"),
        )
        self._backoff.reset()

    def _on_retry(self, result: SendResult) -> float:
        if self._failing_since is None:
            self._failing_since = self._clock()
            self._log.warning("timekeeper_unreachable", detail=result.detail, pending=len(self._buffer))
        delay = self._backoff.next_delay()
        if result.retry_after is not None:
            delay = max(delay, min(result.retry_after, self._backoff.cap))
        return delay

    def _give_up(self, pending: Pending, detail: str) -> None:
        if not self._buffer.remove(pending):
            # A fold absorbed this report while it was being sent: its time travels in the fold.
            self._log.debug("report_folded_while_sending", seq=pending.seq, detail=detail)
            return
        total, seconds = self._record_drop(pending.seconds)
        self._log.error(
            "report_dropped",
            seq=pending.seq,
            reason=detail,
            interval_seconds=round(pending.seconds, 3),
            dropped_reports_total=total,
            dropped_seconds_total=round(seconds, 3),
        )
