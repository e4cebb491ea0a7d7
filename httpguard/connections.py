"""Bounds on each client connection that uvicorn has no setting for, for the webhook and the timekeeper: a
`ConnectionGuard` in front of uvicorn's protocol (composition) caps connections in all and per address,
makes a connection that waits on its client give way to a newcomer from a less crowded address when the
table is full, keeps a deadline on every connection the server is not answering, and answers 431 to an
oversized head or trailer section (docs/webhook.md, "Limits"; docs/security.md, "Hostile clients")."""

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
IDLE_TIMEOUT = "idle_timeout"  # answered, and nothing more came within the keep-alive timeout
WRITE_TIMEOUT = "write_timeout"  # the client took in none of a pending answer for the body's time
HEADERS_TOO_LARGE_REASON = "headers_too_large"
# A connection that gave way to a newcomer, by what the server was waiting on it for.
GAVE_WAY_HEAD = "gave_way_head"
GAVE_WAY_BODY = "gave_way_body"
GAVE_WAY_IDLE = "gave_way_idle"
REASONS = (
    OVER_CAPACITY,
    SOURCE_OVER_CAPACITY,
    HEAD_TIMEOUT,
    BODY_TIMEOUT,
    IDLE_TIMEOUT,
    HEADERS_TOO_LARGE_REASON,
    GAVE_WAY_HEAD,
    GAVE_WAY_BODY,
    GAVE_WAY_IDLE,
    WRITE_TIMEOUT,
)

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
    """The open connections of one server process, in all and by source address (each address's in the
    order they were admitted)."""

    total: int = 0
    by_source: dict[str, dict[ConnectionGuard, None]] = field(default_factory=dict)

    def admit(self, guard: ConnectionGuard, limits: ConnectionLimits) -> str | None:
        """Count a new connection in, making room for it if it may; the reason it is refused instead."""
        held = self.by_source.get(guard.source, {})
        if len(held) >= limits.max_connections_per_source:
            return SOURCE_OVER_CAPACITY
        if self.total >= limits.max_connections:
            giving_way = self._giving_way(len(held))
            if giving_way is None:
                return OVER_CAPACITY
            giving_way.give_way()
        self.total += 1
        self.by_source.setdefault(guard.source, {})[guard] = None
        return None

    def _giving_way(self, newcomer_held: int) -> ConnectionGuard | None:
        """The connection that makes room for a newcomer whose address holds `newcomer_held`: the oldest
        one waiting on its client (`waiting_on_client`) of the address holding the most,
        provided that address holds at least two more than the newcomer's. So a full table is shared
        out between addresses: one address crowding out others loses its waiting connections to them,
        and addresses holding about as many never take turns throwing each other out."""
        if max(map(len, self.by_source.values()), default=0) < newcomer_held + 2:
            return None  # the usual answer under attack, so found without sorting
        for held in sorted(self.by_source.values(), key=len, reverse=True):
            if len(held) < newcomer_held + 2:
                return None
            for guard in held:
                if guard.waiting_on_client():
                    return guard
        return None

    def release(self, guard: ConnectionGuard) -> None:
        self.total -= 1
        held = self.by_source[guard.source]
        del held[guard]
        if not held:
            del self.by_source[guard.source]


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
        self.requests = 0  # begun on this connection
        self.head_bytes = 0
        self.framing_bytes = 0  # of the body being received, read since its last body byte
        self.body_read = False  # by the parser, in the read being parsed
        self.writing_paused = False  # the transport's buffer is full: the client does not read
        self.handshake: asyncio.Future[None] | None = None
        self.early: list[bytes] = []  # what arrived after the TLS handshake, before start_tls returned

    # The connection, before and after TLS.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports subclass none of asyncio's
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.source = str(peer[0]) if isinstance(peer, tuple) else ""
        refused = self.http.table.admit(self, self.limits)
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
            self.http.table.release(self)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.started else None

    def pause_writing(self) -> None:
        """A client that reads no more of its answer holds uvicorn's answer (and the connection) until it
        does: it gets the body's time to, unless a deadline runs already."""
        self.writing_paused = True
        if self.timer is None:
            self._arm(self.limits.body_timeout_seconds, WRITE_TIMEOUT)
        if self.started:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.timer is not None and self.timer_reason == WRITE_TIMEOUT:
            self._disarm()
        if self.started:
            self.inner.resume_writing()

    # Giving way to a newcomer when the table is full.

    def _answering(self) -> bool:
        """Whether uvicorn is answering a request of this connection (its last request's response is
        not complete): the server's turn, not the client's."""
        cycle = getattr(self.inner, "cycle", None)  # uvicorn's RequestResponseCycle, in both its protocols
        return cycle is not None and not cycle.response_complete

    def waiting_on_client(self) -> bool:
        """Whether the server waits on the client alone: for its TLS handshake, a head, a body, to read
        its answer, or (the last answer sent) a next request."""
        if self.writing_paused:
            return True
        return not (self.started and self.parser is not None and self.phase == IDLE and self._answering())

    def give_way(self) -> None:
        """Leave the table now, for a newcomer, and end the connection."""
        assert self.transport is not None
        if self.phase == BODY:
            reason = GAVE_WAY_BODY
        elif self.phase == HEAD or self.requests == 0:
            reason = GAVE_WAY_HEAD
        else:
            reason = GAVE_WAY_IDLE
        self._release()
        self.http.on_refused(reason)
        self.transport.abort()

    # The request framing, read by the guard's own parser.

    def data_received(self, data: bytes) -> None:
        if not self.started:
            self.early.append(data)
            return
        assert self.transport is not None
        if self.transport.is_closing():  # refused: what is still arriving is not for the app
            return
        if self.parser is not None:
            self.body_read = False
            try:
                self.parser.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade):  # malformed, or an upgrade
                self._stop_reading_framing()
            if self._over_head_limit(len(data)):
                self._refuse_head()
                return
        self.inner.data_received(data)
        if self.parser is not None and self.phase == IDLE and self.timer is None and not self._answering():
            # Answered before this request's body ended: uvicorn's keep-alive timer, started at the
            # answer's end, was cancelled by the body's bytes and is not started again.
            self._arm(self.uvicorn_arguments["config"].timeout_keep_alive, IDLE_TIMEOUT)

    def _over_head_limit(self, read: int) -> bool:
        """Counts a read against the head limit: a head's whole, and in a body a read that carried none
        of it (chunk sizes, extensions and trailers, which httptools hands uvicorn as headers). Counted
        whole: a head that began mid-read is overcounted by the rest; a body's last read before its
        trailers is not counted."""
        if self.phase == HEAD:
            self.head_bytes += read
        elif self.phase == BODY and not self.body_read:
            self.framing_bytes += read
        else:
            return False
        return self.head_bytes + self.framing_bytes > self.limits.max_head_bytes

    def _stop_reading_framing(self) -> None:
        """Past a parse error or an upgrade (neither server serves one) the framing is unknown: the
        connection keeps its deadline, or gets the body's."""
        self.parser = None
        if self.timer is None:
            self._arm(self.limits.body_timeout_seconds, BODY_TIMEOUT)

    def _refuse_head(self) -> None:
        """431 and close. Past a body's start (the limit passed in its trailers) the answer may have begun
        (then it gets no 431), and the connection is ended at once: a client streaming a trailer is not
        read on through a TLS close."""
        assert self.transport is not None
        self.http.on_refused(HEADERS_TOO_LARGE_REASON)
        self.parser = None
        self._disarm()
        in_body = self.phase == BODY
        cycle = getattr(self.inner, "cycle", None) if in_body else None
        if cycle is None or not cycle.response_started:
            self.transport.write(HEADERS_TOO_LARGE)
        if in_body:
            self.transport.abort()
        else:
            self.transport.close()

    def on_message_begin(self) -> None:
        self.phase = HEAD
        self.requests += 1
        self.head_bytes = 0
        self.framing_bytes = 0
        if self.timer is None or self.timer_reason != HEAD_TIMEOUT:  # a connection's first keeps its own
            self._arm(self.limits.head_timeout_seconds, HEAD_TIMEOUT)

    def on_headers_complete(self) -> None:
        self.phase = BODY
        self._arm(self.limits.body_timeout_seconds, BODY_TIMEOUT)

    def on_body(self, body: bytes) -> None:
        self.body_read = True
        self.framing_bytes = 0

    def on_message_complete(self) -> None:
        self.phase = IDLE
        self._disarm()
        if self.writing_paused:
            self._arm(self.limits.body_timeout_seconds, WRITE_TIMEOUT)

    # The one deadline: for the head or the body being received, an answer being taken in, or an answered
    # connection's next request.

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
