"""Hostile clients as the outside probe of issue #27 ran them, for the limit tests and bench.hostile.

Each returns what the client saw; a hostile client binds to its own loopback address (`HOSTILE_SOURCE`)
so that the server tells it from the API server or a sidecar on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import yaml

from tests.support.raw_https import is_open

HOSTILE_SOURCE = "127.0.0.2"  # Linux routes all of 127/8 to the loopback
MIB = 2**20
REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_SECONDS = 30.0


def api_server_timeout_seconds() -> float:
    """The shortest timeoutSeconds deployment/ registers the webhooks with: the API server's patience."""
    manifests = yaml.safe_load_all(
        (REPO_ROOT / "deployment/base/webhook/webhookconfigurations.yaml").read_text()
    )
    return float(min(hook["timeoutSeconds"] for manifest in manifests for hook in manifest["webhooks"]))


async def _connect(
    port: int, context: ssl.SSLContext | None, source: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(
        "127.0.0.1",
        port,
        ssl=context,
        server_hostname="localhost" if context else None,
        local_addr=(source, 0),
    )


async def trickle(port: int, ca_pem: str, clients: int, stop: EventType, ready: EventType) -> int:
    """`clients` loops from HOSTILE_SOURCE until `stop` is set: connect over TLS (trusting `ca_pem`), then
    write one byte of a request head a second, reconnecting at once when dropped; `ready` is set once each
    has tried its first connection. Answers how many connections were made."""
    context = ssl.create_default_context(cadata=ca_pem)
    made = 0
    tried = 0
    head = b"POST /mutate HTTP/1.1\r\nHost: webhook\r\nX-Slow: " + b"s" * 10_000

    async def one() -> None:
        nonlocal made, tried
        first = True
        while True:
            try:
                _, writer = await _connect(port, context, HOSTILE_SOURCE)
            except (OSError, ssl.SSLError):
                await asyncio.sleep(0)  # refused: straight back
                continue
            finally:
                if first:
                    first = False
                    tried += 1
                    if tried == clients:
                        ready.set()
            made += 1
            with contextlib.suppress(OSError, ssl.SSLError):
                for byte in head:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    if writer.transport.is_closing():
                        break
                    await asyncio.sleep(1)
            writer.close()

    loops = [asyncio.create_task(one()) for _ in range(clients)]
    await asyncio.to_thread(stop.wait)
    for loop in loops:
        loop.cancel()
    await asyncio.gather(*loops, return_exceptions=True)
    return made


def _trickle_process(
    port: int, ca_pem: str, clients: int, stop: EventType, ready: EventType, made: Synchronized[int]
) -> None:
    made.value = asyncio.run(trickle(port, ca_pem, clients, stop, ready))


async def beside_trickle(
    port: int, ca_pem: str, clients: int, measured: Callable[[], Awaitable[bool]], count: int
) -> tuple[list[bool], int]:
    """`count` calls of `measured`, one every 0.1 s, while `trickle` runs in a process of its own (as the
    API server and the pod are apart) from before the first call until after the last; (their outcomes,
    the connections the trickle made)."""
    spawn = multiprocessing.get_context("spawn")
    made = spawn.Value("i", 0)
    stop, ready = spawn.Event(), spawn.Event()
    child = spawn.Process(target=_trickle_process, args=(port, ca_pem, clients, stop, ready, made))
    child.start()
    try:
        if not await asyncio.to_thread(ready.wait, READY_TIMEOUT_SECONDS):
            raise AssertionError(f"the {clients} trickling clients were not in place")
        outcomes = []
        for _ in range(count):
            outcomes.append(await measured())
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.to_thread(child.join, 30)
        child.kill()
    return outcomes, made.value


async def slow_heads(
    port: int, count: int, waits: Sequence[float], until_closed: bool = False
) -> tuple[int, list[int]]:
    """`count` plain connections from HOSTILE_SOURCE that send half a request head and stop; (connections
    made, how many of them are still open after each of `waits` seconds). With `until_closed` a count is
    taken as soon as none is open, if that comes before its wait is over."""
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    for _ in range(count):
        with contextlib.suppress(OSError):
            reader, writer = await _connect(port, None, HOSTILE_SOURCE)
            writer.write(b"POST /api/v1/reports HTTP/1.1\r\nHost: timekeeper\r\n")
            opened.append((reader, writer))

    counts = []
    started = time.monotonic()
    for wait in waits:
        remaining = max(0.0, started + wait - time.monotonic())
        if until_closed:  # every connection's end (or first byte from the server), for at most `remaining`
            reads = [asyncio.ensure_future(reader.read(1)) for reader, _ in opened]
            _, pending = await asyncio.wait(reads, timeout=remaining) if reads else (set(), set())
            for read in pending:
                read.cancel()
            await asyncio.gather(*reads, return_exceptions=True)
        else:
            await asyncio.sleep(remaining)
        counts.append(sum(await asyncio.gather(*(is_open(reader) for reader, _ in opened))))
    for _, writer in opened:
        writer.close()
    return len(opened), counts


async def huge_header_line(port: int, size: int) -> tuple[bytes, int, float]:
    """A request head with one header line of `size` bytes, written as fast as the server reads it;
    (the server's answer, or b"" when it reset the connection first, the bytes sent by then, and the
    seconds from the first byte until the answer or the reset)."""
    started = time.perf_counter()
    reader, writer = await _connect(port, None, HOSTILE_SOURCE)
    writer.write(b"GET /api/v1/healthz HTTP/1.1\r\nHost: timekeeper\r\nX-Huge: ")
    answer = asyncio.ensure_future(reader.read(4096))
    chunk = b"h" * MIB
    sent = 0
    with contextlib.suppress(OSError):
        while sent < size and not answer.done():
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)
    try:
        got = await asyncio.wait_for(answer, timeout=30)
    except OSError:
        got = b""
    writer.close()
    return got, sent, time.perf_counter() - started


async def hold_plain_sockets(port: int, count: int) -> list[asyncio.StreamWriter]:
    """`count` TCP connections from HOSTILE_SOURCE that never send a byte (no TLS handshake either)."""
    held = []
    for _ in range(count):
        with contextlib.suppress(OSError):
            held.append((await _connect(port, None, HOSTILE_SOURCE))[1])
    return held
