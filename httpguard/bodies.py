"""The request body limit of both servers, as ASGI middleware: a body over `max_bytes` is answered 413,
by its Content-Length before a byte is read, else as soon as the streamed (chunked) body passes it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# What a refusal that closes the connection reads and throws away of the body still arriving, at most,
# and for how long: long enough for the 413 to reach the client, short enough not to hold up a shutdown.
LINGER_BYTES = 16 * 2**20
LINGER_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class BodyTooLarge:
    """A refused body: the limit, and the size its Content-Length declared (None for a streamed body)."""

    limit: int
    declared: int | None


def _nothing() -> None:
    pass


def declared_over(headers: Iterable[tuple[bytes, bytes]], limit: int) -> int | None:
    """The Content-Length, when it declares more than `limit`; None otherwise."""
    for name, value in headers:
        if name == b"content-length":
            # Both servers' parsers refuse a length past 64 bits, so int() converts a short string.
            if value.isdigit() and int(value) > limit:
                return int(value)
            return None
    return None


def _expects_continue(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return any(name == b"expect" and value.lower() == b"100-continue" for name, value in headers)


@dataclass(slots=True)
class BodyLimit:
    """Answers 413 with `render(refusal)` (a JSON body) for a body over `max_bytes`.

    An app reading a streamed body past the limit receives `http.disconnect`, as if the client had left;
    what it answers then is dropped for the 413. With `close`, the 413 ends the connection: first the
    body still arriving is read and thrown away (up to `linger_bytes`), so that the client reads the 413
    rather than a reset (a socket closed with unread data resets). The server's body deadline bounds
    that wait; without `close` the server throws the rest away itself and keeps the connection."""

    app: ASGIApp
    max_bytes: int
    render: Callable[[BodyTooLarge], bytes]
    close: bool = False
    on_refused: Callable[[], None] = _nothing
    linger_bytes: int = LINGER_BYTES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_over(scope["headers"], self.max_bytes)
        if declared is not None:
            # A client waiting for 100 Continue sends no body: there is nothing to read before closing.
            unread = not _expects_continue(scope["headers"])
            await self._refuse(BodyTooLarge(self.max_bytes, declared), receive, send, unread)
            return
        received = 0
        more = True  # whether the body goes on past what the app received
        refused = False
        answering = False  # the app's response began before any refusal

        async def limited() -> Message:
            nonlocal received, more, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                more = message.get("more_body", False)
                if received > self.max_bytes:
                    refused = True
                    return {"type": "http.disconnect"}
            return message

        async def sending(message: Message) -> None:
            nonlocal answering
            if refused and not answering:
                return  # the app's answer to the disconnect it was handed
            answering = True
            await send(message)

        try:
            await self.app(scope, limited, sending)
        except Exception:
            if not refused or answering:
                raise  # else: how the app took the disconnect (e.g. Starlette's ClientDisconnect)
        if refused and not answering:
            await self._refuse(BodyTooLarge(self.max_bytes, None), receive, send, more)

    async def _refuse(self, refusal: BodyTooLarge, receive: Receive, send: Send, unread: bool) -> None:
        self.on_refused()
        body = self.render(refusal)
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        if not self.close:
            await send({"type": "http.response.start", "status": 413, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": True})  # sent, not yet closed
        if unread:
            await self._linger(receive)
        await send({"type": "http.response.body", "body": b""})  # the server closes the connection

    async def _linger(self, receive: Receive) -> None:
        """Read and throw away the body until it ends, the client leaves, `linger_bytes` are read or
        `LINGER_SECONDS` have passed."""
        thrown = 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LINGER_SECONDS):
                while thrown <= self.linger_bytes:
                    message = await receive()
                    if message["type"] != "http.request" or not message.get("more_body", False):
                        return
                    thrown += len(message.get("body", b""))
