"""Hostile clients against `python -m webhook`, measured: what the outside probe of issue #20 did.

- a 100 MB AdmissionReview, declared by Content-Length and sent chunked;
- 2,000 slow connections (TLS done, half a request head, then nothing) and 2,000 that never start TLS;
- reviews of a 10,000-container GPU pod, alone and four at once beside a normal admission.

Each probe reports what the client saw and the webhook process's memory (VmRSS now, VmHWM the peak so
far, from /proc), to hold against the Deployment's 256 MiB limit. Latencies here are client-observed on
a shared machine: they show a stall or its absence, not the webhook's speed (bench.admission does that).

Run: `.venv/bin/python -m bench.hostile`; it prints a table and writes bench/out/hostile.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import ssl
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

from bench.common import PYTHON, REPO_ROOT, Figure, Section, free_port, process, write_results
from tests.support.pods import container, pod, review
from tests.support.raw_https import Connection, is_open, open_tls, post, send_endless_body
from webhook.tls import generate_ca, generate_serving_cert

OUT = REPO_ROOT / "bench" / "out" / "hostile.md"
MIB = 2**20
HUGE_BODY = 100_000_000


def _memory(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of the process in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


class Target:
    def __init__(self, port: int, context: ssl.SSLContext, pid: int) -> None:
        self.port = port
        self.context = context
        self.pid = pid

    async def connect(self) -> Connection:
        return await open_tls(self.port, self.context)

    async def post(self, path: str, body: bytes) -> tuple[int, float]:
        """One request on a new connection: (status, seconds until the whole answer arrived)."""
        started = time.perf_counter()
        answer = await post(self.port, self.context, path, body)
        return int(answer.split(b" ", 2)[1]), time.perf_counter() - started


async def _slow_connections(target: Target, count: int, wait: float) -> tuple[int, int]:
    """`count` connections that complete TLS and send half a request head; (still open after 2 s, still
    open after `wait` s), as the client sees them (a refused one reads end-of-file)."""

    async def one() -> Connection | None:
        try:
            reader, writer = await target.connect()
        except (ConnectionError, ssl.SSLError, TimeoutError):
            return None
        writer.write(b"POST /mutate HTTP/1.1\r\nHost: webhook\r\n")
        return reader, writer

    opened = [c for c in await asyncio.gather(*(one() for _ in range(count))) if c is not None]

    async def still_open() -> int:
        return sum(await asyncio.gather(*(is_open(reader, wait=0.01) for reader, _ in opened)))

    await asyncio.sleep(2)
    early = await still_open()
    await asyncio.sleep(max(0.0, wait - 2))
    late = await still_open()
    for _, writer in opened:
        writer.close()
    return early, late


async def _tcp_only(target: Target, count: int) -> None:
    """Hold `count` TCP connections that never begin the TLS handshake for two seconds."""
    sockets = [await asyncio.open_connection("127.0.0.1", target.port) for _ in range(count)]
    await asyncio.sleep(2)
    for _, writer in sockets:
        writer.close()


def _containers(count: int) -> bytes:
    """A review of a pod with `count` lean GPU containers (10,000 fit in 1 MiB)."""
    many = [{"name": f"c{i}", "resources": {"limits": {"nvidia.com/gpu": 1}}} for i in range(count)]
    return orjson.dumps(review(pod(*many)))


async def _beside_huge(target: Target, huge: bytes, normal: bytes) -> tuple[float, float, list[int]]:
    """(one huge review alone, a normal admission sent just after four huge ones) in seconds, and the
    huge reviews' statuses."""
    _, alone = await target.post("/validate", huge)
    huge_calls = [asyncio.create_task(target.post("/validate", huge)) for _ in range(4)]
    await asyncio.sleep(0.01)
    _, beside = await target.post("/mutate", normal)
    statuses = [status for status, _ in await asyncio.gather(*huge_calls)]
    return alone, beside, statuses


@contextlib.contextmanager
def _webhook(directory: Path) -> Iterator[Target]:
    ca_cert, ca_key = generate_ca("bench CA")
    cert, key = generate_serving_cert(ca_cert, ca_key, "webhook", "bench", extra_sans=("localhost",))
    (directory / "tls.crt").write_bytes(cert)
    (directory / "tls.key").write_bytes(key)
    port = free_port()
    env = {
        "WEBHOOK_TLS_CERT_FILE": str(directory / "tls.crt"),
        "WEBHOOK_TLS_KEY_FILE": str(directory / "tls.key"),
        "WEBHOOK_TIMEKEEPER_URL": "http://127.0.0.1:9",
        "WEBHOOK_LOG_FORMAT": "json",
        "WEBHOOK_WATCH_PRIORITY_CLASSES": "false",  # no API server here
    }
    context = ssl.create_default_context(cadata=ca_cert.decode())
    with process([PYTHON, "-m", "webhook", "--host", "127.0.0.1", "--port", str(port)], env, port) as child:
        time.sleep(1)  # the lifespan's first poll
        yield Target(port, context, child.pid)


def _memory_figures(section: Section, label: str, target: Target, at_rest: float) -> None:
    rss, peak = _memory(target.pid)
    section.figures.append(Figure(f"{label}: peak RSS", peak, "MiB", target="< 256 MiB"))
    section.notes.append(f"{label}: RSS {at_rest:.0f} MiB at rest, {rss:.0f} MiB after")


async def _bodies(target: Target, section: Section) -> None:
    at_rest, _ = _memory(target.pid)
    for chunked in (False, True):
        status, sent = await send_endless_body(await target.connect(), HUGE_BODY, chunked=chunked)
        label = "chunked" if chunked else "declared by Content-Length"
        section.notes.append(f"100 MB body, {label}: `{status}` after {sent / MIB:,.1f} MiB were sent")
    _memory_figures(section, "two 100 MB bodies", target, at_rest)


async def _slow(target: Target, section: Section, count: int, wait: float) -> None:
    at_rest, _ = _memory(target.pid)
    early, late = await _slow_connections(target, count, wait)
    section.figures += [
        Figure(f"{count:,} slow connections: held after 2 s", early, "connections"),
        Figure(f"{count:,} slow connections: held after {wait:g} s", late, "connections"),
    ]
    _memory_figures(section, f"{count:,} slow connections", target, at_rest)


async def _no_tls(target: Target, section: Section, count: int) -> None:
    at_rest, _ = _memory(target.pid)
    await _tcp_only(target, count)
    _memory_figures(section, f"{count:,} connections that never start TLS", target, at_rest)


async def _huge_pods(target: Target, section: Section) -> None:
    at_rest, _ = _memory(target.pid)
    huge = _containers(10_000)
    normal = orjson.dumps(review(pod(container("main", {"nvidia.com/gpu": 1}))))
    alone, beside, statuses = await _beside_huge(target, huge, normal)
    section.figures += [
        Figure("a 10,000-container review alone, client-observed", alone * 1000, "ms"),
        Figure("a normal admission beside four of them, client-observed", beside * 1000, "ms"),
    ]
    section.notes.append(
        f"10,000-container review: {len(huge) / MIB:.2f} MiB, answered {sorted(set(statuses))}"
    )
    _memory_figures(section, "10,000-container reviews", target, at_rest)


def run(slow: int = 2000, wait: float = 12.0) -> Section:
    """Each probe against a fresh `python -m webhook`, so each peak is its own."""
    section = Section("Webhook under hostile clients")
    probes = [
        lambda target: _bodies(target, section),
        lambda target: _slow(target, section, slow, wait),
        lambda target: _no_tls(target, section, slow),
        lambda target: _huge_pods(target, section),
    ]
    for probe in probes:
        with tempfile.TemporaryDirectory() as scratch, _webhook(Path(scratch)) as target:
            asyncio.run(probe(target))
    section.notes.append(f"1-minute load average: {os.getloadavg()[0]:.2f} (a shared 2-core machine)")
    return section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--slow", type=int, default=2000, help="slow connections to open (default 2,000)")
    parser.add_argument("--wait", type=float, default=12.0, help="how long to hold them (default 12 s)")
    args = parser.parse_args()
    section = run(args.slow, args.wait)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    write_results([section], OUT)
    print(OUT.read_text())


if __name__ == "__main__":
    main()
