"""A raw HTTPS client for what well-behaved clients never do: half a request head, a body that never ends.

httpx sends whole requests; these helpers write bytes as a hostile client would and read what the server
answers meanwhile. Used by the webhook's limit tests and by bench.hostile.
"""

from __future__ import annotations

import asyncio
import ssl

CHUNK = 64 * 1024

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def open_tls(port: int, context: ssl.SSLContext) -> Connection:
    return await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="localhost", limit=2**24
    )


async def send_endless_body(connection: Connection, total: int, *, chunked: bool) -> tuple[str, int]:
    """POST up to `total` bytes to /mutate, declared by Content-Length or chunked, stopping as soon as the
    server answers; (the status line, or how the connection ended, and the bytes sent)."""
    reader, writer = connection
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"
    writer.write(f"POST /mutate HTTP/1.1\r\nHost: webhook\r\n{framing}\r\n\r\n".encode())
    answer = asyncio.create_task(reader.readline())
    sent = 0
    chunk = b"x" * CHUNK
    try:
        while sent < total and not answer.done():
            writer.write(b"%x\r\n%s\r\n" % (CHUNK, chunk) if chunked else chunk)
            sent += CHUNK
            await asyncio.wait_for(writer.drain(), timeout=30)
        status = (await asyncio.wait_for(answer, timeout=60)).decode().strip() or "closed without answer"
    except (ConnectionError, TimeoutError, ssl.SSLError) as error:
        answered = answer.done() and answer.exception() is None
        status = answer.result().decode().strip() if answered else type(error).__name__
    writer.close()
    return status, sent


async def is_open(reader: asyncio.StreamReader, wait: float = 0.05) -> bool:
    """Whether the server still holds the connection: nothing to read yet, rather than its end."""
    try:
        return await asyncio.wait_for(reader.read(1), timeout=wait) != b""
    except TimeoutError:
        return True
    except (ConnectionError, ssl.SSLError):
        return False


async def post(port: int, context: ssl.SSLContext, path: str, body: bytes) -> bytes:
    """One whole request on a connection of its own; the raw answer."""
    reader, writer = await open_tls(port, context)
    head = f"POST {path} HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
    writer.write(f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    answer = await reader.read()
    writer.close()
    return answer
