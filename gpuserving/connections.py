"""Bounds on each client connection that uvicorn has no setting for, for the webhook and the timekeeper: a
`ConnectionGuard` in front of uvicorn's protocol (composition) caps connections in all and per address,
times out a head and a body, and answers 431 to an oversized head (docs/webhook.md, "Limits")."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import httptools

_DETAIL = b'{"detail":"the request head is over the limit"}'
HEADERS_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_DETAIL), _DETAIL)
)

# The reasons a connection is refused or dropped, as `on_refused` receives them.
OVER_CAPACITY = "over_capacity"
SOURCE_OVER_CAPACITY = "source_over_capacity"
HEAD_TIMEOUT = "head_timeout"
BODY_TIMEOUT = "body_timeout"
HEADERS_TOO_LARGE_REASON = "headers_too_large"

# Where the guard's parser is: between requests, in a request head, in its body.
IDLE, HEAD, BODY = "idle", "head", "body"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int
    max_connections_per_source: int
    max_head_bytes: int
    head_timeout_seconds: float
    body_timeout_seconds: float


@dataclass(slots=True)
class ConnectionTable:
    """The open connections of one server process, in all and by source address."""

    total: int = 0
    by_source: dict[str, int] = field(default_factory=dict)

    def admit(self, source: str, limits: ConnectionLimits) -> str | None:
        """Count a new connection in; the reason it is refused instead, if any."""
        if self.total >= limits.max_connections:
            return OVER_CAPACITY
        held = self.by_source.get(source, 0)
        if held >= limits.max_connections_per_source:
            return SOURCE_OVER_CAPACITY
        self.total += 1
        self.by_source[source] = held + 1
        return None

    def release(self, source: str) -> None:
        self.total -= 1
        held = self.by_source[source] - 1
        if held:
            self.by_source[source] = held
        else:
            del self.by_source[source]


def _ignore(reason: str) -> None:
    pass


@dataclass(slots=True)
class GuardedHttp:
    """uvicorn's `http` setting: its protocol named `protocol` ("httptools" or "h11") behind a guard. With
    `tls` the guard starts TLS itself once a connection is admitted. Picklable, for uvicorn's worker
    processes."""

    limits: ConnectionLimits
    protocol: str = "httptools"
    tls: ssl.SSLContext | None = None
    on_refused: Callable[[str], None] = _ignore
    table: ConnectionTable = field(default_factory=ConnectionTable)

    def __call__(self, **uvicorn_arguments: Any) -> ConnectionGuard:
        return ConnectionGuard(self, uvicorn_arguments)

    def inner(self, uvicorn_arguments: dict[str, Any]) -> asyncio.Protocol:
        """uvicorn's own protocol for an admitted connection (a refused one never costs one)."""
        from uvicorn.config import HTTP_PROTOCOLS
        from uvicorn.importer import import_from_string

        protocol: asyncio.Protocol = import_from_string(HTTP_PROTOCOLS[self.protocol])(**uvicorn_arguments)
        return protocol


class ConnectionGuard(asyncio.Protocol):
    """One connection: admitted or refused, its heads and bodies timed and sized, the rest uvicorn's."""

    def __init__(self, http: GuardedHttp, uvicorn_arguments: dict[str, Any]) -> None:
        self.http = http
        self.limits = http.limits
        self.uvicorn_arguments = uvicorn_arguments
        self.inner: asyncio.Protocol = asyncio.Protocol()  # uvicorn's, once admitted
        self.transport: asyncio.Transport | None = None
        self.source = ""
        self.admitted = False
        self.started = False  # the inner protocol has its connection
        self.parser: httptools.HttpRequestParser | None = None  # once admitted
        self.timer: asyncio.TimerHandle | None = None
        self.timer_reason = HEAD_TIMEOUT
        self.phase = IDLE
        self.head_bytes = 0
        self.handshake: asyncio.Future[None] | None = None
        self.early: list[bytes] = []  # what arrived after the TLS handshake, before start_tls returned

    # The connection, before and after TLS.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports subclass none of asyncio's
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.source = str(peer[0]) if isinstance(peer, tuple) else ""
        refused = self.http.table.admit(self.source, self.limits)
        if refused is not None:
            self.http.on_refused(refused)
            transport.abort()
            return
        self.admitted = True
        self.inner = self.http.inner(self.uvicorn_arguments)
        self.parser = httptools.HttpRequestParser(self)
        self._arm(self.limits.head_timeout_seconds, HEAD_TIMEOUT)
        if self.http.tls is None:
            self._start(transport)
        else:
            transport.pause_reading()  # until start_tls has put TLS in front of this protocol
            self.handshake = asyncio.ensure_future(self._start_tls(transport, self.http.tls))

    async def _start_tls(self, transport: asyncio.Transport, context: ssl.SSLContext) -> None:
        try:
            secure = await asyncio.get_running_loop().start_tls(
                transport,
                self,
                context,
                server_side=True,
                ssl_shutdown_timeout=self.limits.head_timeout_seconds,  # a peer that never acknowledges
            )
        except Exception:  # reset, refused or timed out: it never reached the app
            self._release()
            return
        finally:
            self.handshake = None  # no cycle through the finished task
        if secure is None or secure.is_closing():
            self._release()
            return
        self._start(secure)

    def _start(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.started = True
        self.inner.connection_made(transport)
        early, self.early = self.early, []
        for data in early:
            self.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        if self.started:
            self.started = False
            self.inner.connection_lost(exc)

    def _release(self) -> None:
        self._disarm()
        if self.admitted:
            self.admitted = False
            self.http.table.release(self.source)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.started else None

    def pause_writing(self) -> None:
        if self.started:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.started:
            self.inner.resume_writing()

    # The request framing, read by the guard's own parser.

    def data_received(self, data: bytes) -> None:
        if not self.started:
            self.early.append(data)
            return
        assert self.transport is not None
        if self.transport.is_closing():  # refused: what is still arriving is not for the app
            return
        if self.parser is not None:
            if self.timer is None and self.phase == IDLE:
                self._arm(self.limits.head_timeout_seconds, HEAD_TIMEOUT)  # a next request's first byte
            try:
                self.parser.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade):  # malformed, or an upgrade
                self._stop_reading_framing()
            if self.phase == HEAD:  # counted whole: a head that began mid-read is overcounted by the rest
                self.head_bytes += len(data)
                if self.head_bytes > self.limits.max_head_bytes:
                    self._refuse_head()
                    return
        self.inner.data_received(data)

    def _stop_reading_framing(self) -> None:
        """Past a parse error or an upgrade (neither server serves one) the framing is unknown: the
        connection keeps its deadline, or gets the body's."""
        self.parser = None
        if self.timer is None:
            self._arm(self.limits.body_timeout_seconds, BODY_TIMEOUT)

    def _refuse_head(self) -> None:
        assert self.transport is not None
        self.http.on_refused(HEADERS_TOO_LARGE_REASON)
        self.parser = None
        self._disarm()
        self.transport.write(HEADERS_TOO_LARGE)
        self.transport.close()

    def on_message_begin(self) -> None:
        self.phase = HEAD
        self.head_bytes = 0

    def on_headers_complete(self) -> None:
        self.phase = BODY
        self._arm(self.limits.body_timeout_seconds, BODY_TIMEOUT)

    def on_message_complete(self) -> None:
        self.phase = IDLE
        self._disarm()

    # The one deadline, for the head or the body being received.

    def _arm(self, seconds: float, reason: str) -> None:
        self._disarm()
        self.timer_reason = reason
        self.timer = asyncio.get_running_loop().call_later(seconds, self._expire)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self) -> None:
        self.timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.http.on_refused(self.timer_reason)
            self.transport.abort()
