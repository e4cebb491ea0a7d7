"""Hostile clients as the outside probes of issues #27 and #38 ran them, for the limit tests and
bench.hostile.

Each returns what the client saw; a hostile client binds to loopback addresses of its own
(`HOSTILE_SOURCE`, or `hostile_sources(n)`: a tenant's pods are many addresses) so that the server tells it
from the API server or a sidecar on 127.0.0.1. `beside_hostile` runs them in a process of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

import orjson
import yaml

from tests.support.raw_https import Connection, is_open
from tests.support.timekeeper import report_body

HOSTILE_SOURCE = "127.0.0.2"  # Linux routes all of 127/8 to the loopback
MIB = 2**20
REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_SECONDS = 30.0


def hostile_sources(count: int) -> tuple[str, ...]:
    """`count` loopback addresses from HOSTILE_SOURCE up: the pods of one tenant."""
    return tuple(f"127.0.0.{2 + index}" for index in range(count))


def api_server_timeout_seconds() -> float:
    """The shortest timeoutSeconds deployment/ registers the webhooks with: the API server's patience."""
    manifests = yaml.safe_load_all(
        (REPO_ROOT / "deployment/base/webhook/webhookconfigurations.yaml").read_text()
    )
    return float(min(hook["timeoutSeconds"] for manifest in manifests for hook in manifest["webhooks"]))


def image_malloc_env(image: str) -> dict[str, str]:
    """The allocator settings `image` ("webhook", "timekeeper") runs with: its Dockerfile's `ENV MALLOC_...`
    lines, so that a test's process has the image's memory behaviour."""
    dockerfile = (REPO_ROOT / f"deployment/images/{image}.Dockerfile").read_text()
    lines = [line.split(None, 1)[1] for line in dockerfile.splitlines() if line.startswith("ENV MALLOC_")]
    return dict(line.split("=", 1) for line in lines)


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


@dataclass(frozen=True, slots=True)
class Hostile:
    """Hostile clients to run in a process of their own: `clients` of `kind`, spread over `sources` in
    turn, at `port` (TLS when `ca_pem` is given). Kinds:

    - "trickle": write `head` one byte a second, reconnecting at once when dropped, until stopped;
    - "slow_heads": write `head` (half a request head) once and stay silent;
    - "answer_before_body": write `head` (a whole head that declares a body), read the answer, then write
      `body` and stay silent (uvicorn's keep-alive timer, started by the answer, is cancelled by it).

    The silent kinds count how many of their connections are still open `checks` seconds after the last
    was opened."""

    kind: str
    port: int
    clients: int
    sources: tuple[str, ...] = (HOSTILE_SOURCE,)
    ca_pem: str | None = None
    head: bytes = b"POST /mutate HTTP/1.1\r\nHost: webhook\r\nX-Slow: " + b"s" * 10_000
    body: bytes = b""
    checks: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class HostileOutcome:
    """What the hostile process saw: connections made, and open at each of its `checks`."""

    made: int
    still_open: tuple[int, ...]


async def _trickle(
    hostile: Hostile, context: ssl.SSLContext | None, stop: EventType, ready: EventType
) -> int:
    made = 0
    tried = 0

    async def one(source: str) -> None:
        nonlocal made, tried
        first = True
        while True:
            try:
                _, writer = await _connect(hostile.port, context, source)
            except (OSError, ssl.SSLError):
                await asyncio.sleep(0)  # refused: straight back
                continue
            finally:
                if first:
                    first = False
                    tried += 1
                    if tried == hostile.clients:
                        ready.set()
            made += 1
            with contextlib.suppress(OSError, ssl.SSLError):
                for byte in hostile.head:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    if writer.transport.is_closing():
                        break
                    await asyncio.sleep(1)
            writer.close()

    sources = hostile.sources
    loops = [asyncio.create_task(one(sources[i % len(sources)])) for i in range(hostile.clients)]
    await asyncio.to_thread(stop.wait)
    for loop in loops:
        loop.cancel()
    await asyncio.gather(*loops, return_exceptions=True)
    return made


async def _ended(reader: asyncio.StreamReader, wait: float) -> bool:
    """Whether the server ended the connection within `wait` seconds (what it answered read and dropped)."""
    try:
        async with asyncio.timeout(wait):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except (OSError, ssl.SSLError):
        pass
    return True


async def _open_silent(hostile: Hostile, context: ssl.SSLContext | None, source: str) -> Connection | None:
    try:
        reader, writer = await _connect(hostile.port, context, source)
        writer.write(hostile.head)
        if hostile.kind == "answer_before_body":
            if not await asyncio.wait_for(reader.read(65536), timeout=30):
                return None  # dropped, not answered
            writer.write(hostile.body)
    except (OSError, ssl.SSLError, TimeoutError):
        return None
    return reader, writer


async def _silent(
    hostile: Hostile, context: ssl.SSLContext | None, stop: EventType, ready: EventType
) -> HostileOutcome:
    sources = hostile.sources
    opened = await asyncio.gather(
        *(_open_silent(hostile, context, sources[i % len(sources)]) for i in range(hostile.clients))
    )
    held = [connection for connection in opened if connection is not None]
    ready.set()
    started = time.monotonic()
    counts = []
    for check in hostile.checks:
        ended = await asyncio.gather(
            *(_ended(reader, max(0.05, started + check - time.monotonic())) for reader, _ in held)
        )
        counts.append(len(held) - sum(ended))
    await asyncio.to_thread(stop.wait)  # held until the calls beside them are done
    for _, writer in held:
        writer.close()
    return HostileOutcome(len(held), tuple(counts))


async def run_hostile(hostile: Hostile, stop: EventType, ready: EventType) -> HostileOutcome:
    context = ssl.create_default_context(cadata=hostile.ca_pem) if hostile.ca_pem else None
    if hostile.kind == "trickle":
        return HostileOutcome(await _trickle(hostile, context, stop, ready), ())
    return await _silent(hostile, context, stop, ready)


def _hostile_process(
    hostile: Hostile, stop: EventType, ready: EventType, made: Synchronized[int], counts: Any
) -> None:
    outcome = asyncio.run(run_hostile(hostile, stop, ready))
    made.value = outcome.made
    counts[: len(outcome.still_open)] = outcome.still_open


async def beside_hostile(
    hostile: Hostile, measured: Callable[[], Awaitable[bool]], count: int, interval: float = 0.1
) -> tuple[list[bool], HostileOutcome]:
    """`count` calls of `measured`, one every `interval` s, while `hostile` runs in a process of its own
    (as the API server or a sidecar and the tenant's pods are apart), from once its clients are in place
    until after the last call (and its last check); (their outcomes, what the hostile process saw)."""
    spawn = multiprocessing.get_context("spawn")
    made = spawn.Value("i", 0)
    counts = spawn.Array("i", len(hostile.checks))
    stop, ready = spawn.Event(), spawn.Event()
    child = spawn.Process(target=_hostile_process, args=(hostile, stop, ready, made, counts))
    child.start()
    try:
        if not await asyncio.to_thread(ready.wait, READY_TIMEOUT_SECONDS + hostile.clients / 50):
            raise AssertionError(f"the {hostile.clients} hostile clients were not in place")
        outcomes = []
        for _ in range(count):
            outcomes.append(await measured())
            await asyncio.sleep(interval)
    finally:
        stop.set()
        await asyncio.to_thread(child.join, 30 + max(hostile.checks, default=0))
        child.kill()
    return outcomes, HostileOutcome(made.value, tuple(counts[:]))


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


async def huge_trailer(
    port: int, size: int, head: bytes, context: ssl.SSLContext | None = None, source: str = HOSTILE_SOURCE
) -> tuple[bytes, int, float]:
    """`head` (a chunked request head), a one-byte chunk, the last chunk and one trailer line of `size`
    bytes, written as fast as the server reads it; (the first bytes the server answered, b"" when none
    came before it ended the connection, the bytes sent, the seconds from the first byte until the
    connection ended, or 30 when it did not)."""
    started = time.perf_counter()
    reader, writer = await _connect(port, context, source)
    writer.write(head + b"1\r\nx\r\n0\r\nX-Trailer: ")
    answered = b""

    async def until_ended() -> None:
        nonlocal answered
        with contextlib.suppress(OSError, ssl.SSLError):
            while data := await reader.read(65536):
                answered = answered or data

    ended = asyncio.ensure_future(until_ended())
    chunk = b"t" * MIB
    sent = 0
    with contextlib.suppress(OSError, ssl.SSLError):
        while sent < size and not ended.done():
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ended, timeout=max(0.0, 30 - (time.perf_counter() - started)))
    elapsed = time.perf_counter() - started
    writer.close()
    return answered, sent, elapsed


async def plain_request(port: int, request: bytes, patience: float) -> int:
    """`request` (whole, with `Connection: close`) on a new plain connection from 127.0.0.1; the status
    answered within `patience` s, 0 when none was."""
    try:
        async with asyncio.timeout(patience):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            status = await reader.readline()
            writer.close()
        return int(status.split(b" ", 2)[1])
    except (OSError, TimeoutError, IndexError, ValueError):
        return 0


def good_timekeeper_requests(
    port: int, reporter: str, reader: str, latencies: list[float] | None = None
) -> Callable[[], Awaitable[bool]]:
    """A sidecar's report and a budget read (`reader` may read team-a) in turn, each on a new connection
    from 127.0.0.1, passed when answered 200 within 5 s (a stall's measure: a sidecar buffers and retries);
    the seconds each took go to `latencies`."""
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=2)
    calls = itertools.count()

    async def good() -> bool:
        index = next(calls)
        began = time.perf_counter()
        if index % 2:
            head = f"GET /api/v1/namespaces/team-a/budget HTTP/1.1\r\nAuthorization: Bearer {reader}\r\n"
            body = b""
        else:
            body = orjson.dumps(report_body(pod=f"good-{index}", pod_uid=f"uid-good-{index}", start=start))
            head = (
                f"POST /api/v1/reports HTTP/1.1\r\nAuthorization: Bearer {reporter}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            )
        request = f"{head}Host: timekeeper\r\nConnection: close\r\n\r\n".encode() + body
        status = await plain_request(port, request, 5)
        if latencies is not None:
            latencies.append(time.perf_counter() - began)
        return status == 200

    return good
