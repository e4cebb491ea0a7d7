"""The bounds on a client that uvicorn's settings leave open, added to its httptools protocol.

uvicorn bounds the idle time between requests (`timeout_keep_alive`), but not the time to receive one:
that timer is armed only after a response and is cancelled by every byte, so a client that connects and
sends half a request head, or trickles it, holds its connection for ever (slowloris). Its httptools
parser (llhttp) sets no limit on the size of a request head, and uvicorn keeps every header line.
`limit_concurrency` answers 503 to a request that arrives while that many connections are open, but
never closes the idle ones, so 2,000 silent connections are all held. This protocol adds:

- a deadline to receive each whole request (head and body), from the connection's start or the next
  request's first byte: the connection is dropped when it passes;
- a cap on the bytes of a request head (exact to within one read from the socket): 431, then closed;
- a cap on open connections: one beyond it is dropped as soon as its TLS handshake completes;
- each response written to the socket once (`OneWriteResponse`): one TLS record and one send where
  uvicorn makes two;
- the same deadline on a TLS handshake and on a TLS close, which uvicorn leaves at the event loop's
  defaults (60 s and 30 s): a connection that never starts TLS, or whose peer never acknowledges the
  close after a 413, is gone after `request_timeout_seconds` (`WebhookServer`).

The body's limit is the app's (`webhook.app.read_body`), where the declared length can be answered 413.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import Any, cast

import uvicorn
import uvloop
from prometheus_client import Counter
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_DETAIL = b'{"detail":"the request head is over the limit"}'
HEADERS_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_DETAIL), _DETAIL)
)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int
    max_header_bytes: int
    request_timeout_seconds: float


def guarded_protocol(limits: ConnectionLimits, refused: Counter) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with `limits`; each refusal is counted in `refused` by reason."""
    over_capacity = refused.labels(reason="over_capacity")
    timed_out = refused.labels(reason="request_timeout")
    head_too_large = refused.labels(reason="headers_too_large")

    class GuardedProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._deadline: asyncio.TimerHandle | None = None
            self._in_head = True  # the bytes arriving now belong to a request head
            self._head_bytes = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                over_capacity.inc()
                transport.abort()
                return
            self._arm()

        def _arm(self) -> None:
            self._deadline = self.loop.call_later(limits.request_timeout_seconds, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                timed_out.inc()
                self.transport.abort()

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # the first byte of the next request on a kept-alive connection
            started_in_head = self._in_head
            super().data_received(data)
            if not (started_in_head and self._in_head) or self.transport.is_closing():
                return
            self._head_bytes += len(data)
            if self._head_bytes > limits.max_header_bytes:
                head_too_large.inc()
                self._disarm()
                self.transport.write(HEADERS_TOO_LARGE)
                self.transport.close()

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and not isinstance(cycle.transport, OneWriteResponse):
                # Before its task first runs. The cycle calls only write, close and is_closing.
                cycle.transport = cast(asyncio.Transport, OneWriteResponse(cycle.transport, cycle))

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()
            self._in_head = True
            self._head_bytes = 0

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedProtocol


class OneWriteResponse:
    """The transport one request's response is written through: the head is held until the body's first
    write and sent with it, so a response leaves as one TLS record in one send instead of two (uvicorn
    writes the head and the body separately, and each write is encrypted and sent at once). A "100
    Continue" goes out as it comes; a response that ends before its body (a failure, a close) sends the
    head first."""

    __slots__ = ("_cycle", "_head_seen", "_held", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        self._cycle = cycle
        self._held: bytes | None = None
        self._head_seen = False

    def write(self, data: bytes) -> None:
        if not self._head_seen and self._cycle.response_started:
            self._head_seen = True  # uvicorn's first write after it starts the response is the head
            self._held = data
            return
        if self._held is not None:
            data = self._held + data
            self._held = None
        self._transport.write(data)

    def _flush(self) -> None:
        if self._held is not None:
            self._transport.write(self._held)
            self._held = None

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:  # anything else uvicorn may ask of a transport
        self._flush()
        return getattr(self._transport, name)


class _TlsTimeoutLoop(uvloop.Loop):
    """uvloop, with every TLS server's handshake and close bounded by `tls_timeout` seconds."""

    tls_timeout: float

    async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.AbstractServer:  # type: ignore[override]
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", self.tls_timeout)
            kwargs.setdefault("ssl_shutdown_timeout", self.tls_timeout)
        return await super().create_server(*args, **kwargs)


class WebhookServer(uvicorn.Server):
    """uvicorn's server on a loop whose TLS handshakes and closes time out after `tls_timeout` seconds
    (uvicorn has no setting for either and passes none to the loop)."""

    def __init__(self, config: uvicorn.Config, tls_timeout: float) -> None:
        super().__init__(config)
        self.tls_timeout = tls_timeout

    def _new_loop(self) -> asyncio.AbstractEventLoop:
        loop = _TlsTimeoutLoop()
        loop.tls_timeout = self.tls_timeout
        return loop

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        with asyncio.Runner(loop_factory=self._new_loop) as runner:
            runner.run(self.serve(sockets=sockets))
