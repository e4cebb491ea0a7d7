"""The body limit both servers share (httpguard.bodies): in front of a small ASGI app, on uvicorn over
real sockets with each of its HTTP protocols."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import uvicorn

from httpguard.bodies import BodyLimit, BodyTooLarge, Message, Receive, Scope, Send

LIMIT = 1024
MIB = 2**20


def _render(refusal: BodyTooLarge) -> bytes:
    return orjson.dumps({"detail": "too large", "limit": refusal.limit, "declared": refusal.declared})


class Echo:
    """Answers 200 with the body's size; what it received on the way, and whether it saw a disconnect."""

    def __init__(self) -> None:
        self.called = 0
        self.disconnected = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.called += 1
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                raise ConnectionAbortedError("the client left")  # as Starlette's ClientDisconnect does
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"%d" % size
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", b"%d" % len(body))],
            }
        )
        await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def _served(app: Any, protocol: str) -> AsyncIterator[int]:
    """uvicorn serving `app` with its `protocol` ("h11" or "httptools") on a free port."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, http=protocol, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 (uvicorn offers a flag, no event)
        await asyncio.sleep(0.01)
    port: int = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield port
    finally:
        server.should_exit = True
        await serving


async def _send_until_answered(port: int, head: bytes, total: int, chunked: bool) -> tuple[bytes, bytes]:
    """Write `head`, then up to `total` body bytes until the server answers; (its status line, the rest
    of what it sent until it closed). A reset shows as ConnectionResetError."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    status = asyncio.create_task(reader.readline())
    sent = 0
    while sent < total and not status.done():
        chunk = b"x" * min(65536, total - sent)
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
        sent += len(chunk)
        await writer.drain()
    line = await asyncio.wait_for(status, timeout=10)
    writer.write_eof()  # done sending: the server lingers until the client stops
    rest = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    return line, rest


def _head(framing: str, *extra: str) -> bytes:
    lines = ["POST /reviews HTTP/1.1", "Host: test", framing, *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_a_body_within_the_limit_reaches_the_app() -> None:
    app = Echo()
    async with _served(BodyLimit(app, LIMIT, _render), "httptools") as port:
        status, rest = await _send_until_answered(port, _head(f"Content-Length: {LIMIT}"), LIMIT, False)

    assert status.startswith(b"HTTP/1.1 200")
    assert rest.endswith(b"\r\n\r\n%d" % LIMIT)


@pytest.mark.parametrize("protocol", ["h11", "httptools"])
async def test_a_declared_body_over_the_limit_is_refused_before_the_app_reads_a_byte(protocol: str) -> None:
    app, refused = Echo(), []
    limited = BodyLimit(app, LIMIT, _render, on_refused=lambda: refused.append(1))
    async with _served(limited, protocol) as port:
        status, rest = await _send_until_answered(port, _head(f"Content-Length: {MIB}"), MIB, False)

    assert status.startswith(b"HTTP/1.1 413")
    assert orjson.loads(rest.split(b"\r\n\r\n", 1)[1]) == {
        "detail": "too large",
        "limit": LIMIT,
        "declared": MIB,
    }
    assert app.called == 0 and refused == [1]


@pytest.mark.parametrize("protocol", ["h11", "httptools"])
async def test_a_streamed_body_is_refused_once_past_the_limit_and_the_apps_answer_dropped(
    protocol: str,
) -> None:
    app = Echo()
    async with _served(BodyLimit(app, LIMIT, _render), protocol) as port:
        status, rest = await _send_until_answered(port, _head("Transfer-Encoding: chunked"), MIB, True)

    assert status.startswith(b"HTTP/1.1 413")
    assert orjson.loads(rest.split(b"\r\n\r\n", 1)[1])["declared"] is None
    assert app.disconnected  # the app was told the client left; its exception and answer went nowhere


@pytest.mark.parametrize("protocol", ["h11", "httptools"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_closing_refusal_reads_the_rest_first_so_the_client_gets_the_413(
    protocol: str, chunked: bool
) -> None:
    """A socket closed with unread data resets, and a reset can overtake the 413 on its way."""
    app = Echo()
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {16 * MIB}"
    async with _served(BodyLimit(app, LIMIT, _render, close=True), protocol) as port:
        status, rest = await _send_until_answered(port, _head(framing), 16 * MIB, chunked)

    assert status.startswith(b"HTTP/1.1 413")
    head, body = rest.split(b"\r\n\r\n", 1)
    assert b"connection: close" in head.lower()
    assert orjson.loads(body)["detail"] == "too large"  # and then the server closed: read() ended


async def test_a_closing_refusal_of_a_client_waiting_for_100_continue_waits_for_no_body() -> None:
    async with _served(BodyLimit(Echo(), LIMIT, _render, close=True), "httptools") as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head(f"Content-Length: {MIB}", "Expect: 100-continue"))
        answer = await asyncio.wait_for(reader.read(), timeout=10)  # closed without a body sent
        writer.close()

    assert answer.startswith(b"HTTP/1.1 413") and b"100 Continue" not in answer


async def test_without_close_the_connection_serves_the_next_request_after_a_refusal() -> None:
    async with _served(BodyLimit(Echo(), LIMIT, _render), "httptools") as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            _head(f"Content-Length: {4 * LIMIT}") + b"x" * 4 * LIMIT + _head("Content-Length: 2") + b"ok"
        )
        refused = await reader.readuntil(b"}")
        served = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n2"), timeout=10)
        writer.close()

    assert refused.startswith(b"HTTP/1.1 413")
    assert served.startswith(b"HTTP/1.1 200")


async def test_a_lifespan_or_websocket_scope_passes_untouched() -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    async def nothing() -> Message:
        return {}

    async def ignore(message: Message) -> None:
        pass

    await BodyLimit(app, LIMIT, _render)({"type": "lifespan"}, nothing, ignore)

    assert seen == ["lifespan"]
