"""Hostile clients against `python -m webhook` and `python -m timekeeper` (the probes of issues #20, #27 and
#38): huge bodies, headers and trailers, slow and trickling connections from one address and from many,
connections answered before their body, sockets that never start TLS, huge pods; what the client saw and
the server's RSS. Latencies show a stall or its absence, not speed (bench.admission does).

`--baseline TREE` (a checkout of the code before a change, e.g. `git archive main | tar -x -C TREE`) adds
the cost at rest: admission and report latencies with no attack, served from TREE and from here in turn."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import re
import ssl
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import PYTHON, REPO_ROOT, Figure, Section, free_port, percentile, process, write_results
from bench.ingest import Server, timekeeper
from tests.support.hostile_clients import (
    MIB,
    Hostile,
    api_server_timeout_seconds,
    beside_hostile,
    good_timekeeper_requests,
    hold_plain_sockets,
    hostile_sources,
    huge_header_line,
    huge_trailer,
    image_malloc_env,
    plain_request,
    slow_heads,
)
from tests.support.pods import container, pod, review
from tests.support.raw_https import Connection, is_open, open_tls, post, send_endless_body
from tests.support.timekeeper import bearer, report_body
from webhook.certificates.tls import generate_ca, generate_serving_cert

OUT = REPO_ROOT / "bench" / "out" / "hostile.md"
HUGE_BODY = 100_000_000


def _memory(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of the process in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


class Target:
    def __init__(self, port: int, ca_pem: str, pid: int) -> None:
        self.port = port
        self.ca_pem = ca_pem
        self.context = ssl.create_default_context(cadata=ca_pem)
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


def _command(module: str, tree: Path | None) -> list[str]:
    """`python -m module`, its packages from `tree` (another checkout) when given."""
    if tree is None:
        return [PYTHON, "-m", module]
    launch = (
        "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
        "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
    )
    return [PYTHON, "-c", launch, str(tree), module]


@contextlib.contextmanager
def _webhook(directory: Path, tree: Path | None = None) -> Iterator[Target]:
    ca_cert, ca_key = generate_ca("bench CA")
    cert, key = generate_serving_cert(ca_cert, ca_key, "webhook", "bench", extra_sans=("localhost",))
    (directory / "tls.crt").write_bytes(cert)
    (directory / "tls.key").write_bytes(key)
    port = free_port()
    env = {
        **image_malloc_env("webhook"),
        "WEBHOOK_TLS_CERT_FILE": str(directory / "tls.crt"),
        "WEBHOOK_TLS_KEY_FILE": str(directory / "tls.key"),
        "WEBHOOK_TIMEKEEPER_URL": "http://127.0.0.1:9",
        "WEBHOOK_LOG_FORMAT": "json",
        "WEBHOOK_WATCH_PRIORITY_CLASSES": "false",  # no API server here
    }
    with process(
        [*_command("webhook", tree), "--host", "127.0.0.1", "--port", str(port)], env, port
    ) as child:
        time.sleep(1)  # the lifespan's first poll
        yield Target(port, ca_cert.decode(), child.pid)


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


async def _admissions_beside_trickle(target: Target, section: Section, clients: int) -> None:
    """Admissions on new connections from 127.0.0.1, one every 0.1 s, while `clients` trickle."""
    normal = orjson.dumps(review(pod(container("main", {"nvidia.com/gpu": 1}))))
    latencies: list[float] = []
    patience = api_server_timeout_seconds()

    async def admission() -> bool:
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            status, seconds = await asyncio.wait_for(target.post("/mutate", normal), patience)
            latencies.append(seconds * 1000)
            return status == 200
        return False

    hostile = Hostile("trickle", target.port, clients, ca_pem=target.ca_pem)
    outcomes, seen = await beside_hostile(hostile, admission, 60)
    made = seen.made
    section.figures += [
        Figure(
            f"{clients:,} trickling clients: admissions on new connections passed",
            100 * sum(outcomes) / len(outcomes),
            "%",
            target="≥ 99 %",
        ),
        Figure(
            f"{clients:,} trickling clients: admission p50, client-observed", percentile(latencies, 0.5), "ms"
        ),
        Figure(
            f"{clients:,} trickling clients: admission p99, client-observed",
            percentile(latencies, 0.99),
            "ms",
        ),
    ]
    section.notes.append(
        f"{clients:,} trickling clients from 127.0.0.2 (TLS, then 1 byte/s, reconnecting at once; a process"
        f" of their own) made {made:,} connections; {len(outcomes)} admissions from 127.0.0.1, each passed"
        f" when answered 200 within the webhooks' timeoutSeconds ({patience:g} s)"
    )


async def _pre_tls_sockets(target: Target, section: Section, count: int) -> None:
    at_rest, _ = _memory(target.pid)
    held = await hold_plain_sockets(target.port, count)
    await asyncio.sleep(1)
    during, _ = _memory(target.pid)
    for writer in held:
        writer.close()
    await asyncio.sleep(5)  # the admitted ones end as their peers go
    after, _ = _memory(target.pid)
    section.figures += [
        Figure(f"{count:,} sockets that never start TLS: RSS while held", during, "MiB", target="< 256 MiB"),
        Figure(
            f"{count:,} sockets that never start TLS: RSS after",
            after,
            "MiB",
            baseline=at_rest,
            baseline_name="RSS at rest",
        ),
    ]


async def _report_ms(url: str, token: str, pod_name: str) -> float:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=2)
    body = report_body(pod=pod_name, pod_uid=f"uid-{pod_name}", start=start)
    async with httpx.AsyncClient(base_url=f"{url}/api/v1", timeout=30) as client:
        started = time.perf_counter()
        answer = await client.post("/reports", json=body, headers=bearer(token))
        assert answer.status_code == 200, answer.text
        return (time.perf_counter() - started) * 1000


async def _huge_header(url: str, token: str, section: Section) -> None:
    """Reports one after another at rest, then while six clients send 64 MiB header lines back to back."""
    port = int(url.rsplit(":", 1)[1])
    at_rest = [await _report_ms(url, token, f"rest-{i}") for i in range(50)]
    refusals: list[tuple[bytes, int, float]] = []
    done = asyncio.Event()

    async def hostile() -> None:
        while not done.is_set():
            refusals.append(await huge_header_line(port, 64 * MIB))

    senders = [asyncio.ensure_future(hostile()) for _ in range(6)]
    await asyncio.sleep(0.05)
    beside_huge = [await _report_ms(url, token, f"beside-{i}") for i in range(50)]
    done.set()
    await asyncio.gather(*senders)
    seconds = [elapsed for _, _, elapsed in refusals]
    section.figures += [
        Figure("64 MiB header line: refused after, worst", max(seconds) * 1000, "ms", target="< 1,000 ms"),
        Figure(
            "a report beside them, p50",
            percentile(beside_huge, 0.5),
            "ms",
            baseline=percentile(at_rest, 0.5),
            baseline_name="a report at rest, p50",
        ),
        Figure(
            "a report beside them, p99",
            percentile(beside_huge, 0.99),
            "ms",
            baseline=percentile(at_rest, 0.99),
            baseline_name="a report at rest, p99",
        ),
    ]
    answers = sorted({answer.split(b"\r\n", 1)[0].decode() or "reset first" for answer, _, _ in refusals})
    most = max(sent for _, sent, _ in refusals)
    section.notes.append(
        f"64 MiB header lines: six clients back to back, {len(refusals)} lines while 50 reports ran one after"
        f" another; answered {answers}, at most {most / MIB:,.0f} MiB sent before it"
    )


async def _slow_heads(url: str, section: Section, count: int, head_timeout: float) -> None:
    port = int(url.rsplit(":", 1)[1])
    opened, (early, late) = await slow_heads(port, count, [1.0, head_timeout + 1])
    section.figures += [
        Figure(f"{count:,} slow heads: open after 1 s", early, "connections"),
        Figure(f"{count:,} slow heads: open after {head_timeout + 1:g} s", late, "connections", target="0"),
    ]
    section.notes.append(
        f"{count:,} slow heads from one address ({opened:,} connections made): the server keeps at most"
        " TIMEKEEPER_MAX_CONNECTIONS_PER_SOURCE (200) of them, each until TIMEKEEPER_HEAD_TIMEOUT_SECONDS"
    )


def run_issue_27() -> Section:
    """Issue #27's probes: the timekeeper's first, then each webhook probe against a fresh webhook."""
    section = Section("Hostile clients at both servers (issue #27)")
    with timekeeper() as server:
        asyncio.run(_huge_header(server.url, server.token, section))
        asyncio.run(_slow_heads(server.url, section, 3000, 10.0))
    probes = [
        lambda target: _admissions_beside_trickle(target, section, 150),
        lambda target: _admissions_beside_trickle(target, section, 1000),
        lambda target: _pre_tls_sockets(target, section, 10_000),
    ]
    for probe in probes:
        with tempfile.TemporaryDirectory() as scratch, _webhook(Path(scratch)) as target:
            asyncio.run(probe(target))
    section.notes.append(f"1-minute load average: {os.getloadavg()[0]:.2f} (a shared 2-core machine)")
    return section


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f}"


def _connections_refused(server: Server) -> str:
    """The timekeeper's non-zero `timekeeper_connections_refused_total` series, as "reason count"."""
    scrape = httpx.get(f"{server.url}/api/v1/metrics", headers={"Authorization": f"Bearer {server.reader}"})
    series = re.findall(r'^timekeeper_connections_refused_total\{reason="(\w+)"\} (\S+)$', scrape.text, re.M)
    return ", ".join(f"{reason} {float(value):,.0f}" for reason, value in series if float(value))


def _passed(section: Section, label: str, outcomes: Sequence[bool], latencies: Sequence[float]) -> None:
    section.figures += [
        Figure(f"{label}: passed", 100 * sum(outcomes) / len(outcomes), "%", target="≥ 95 %"),
        Figure(f"{label}: p99, client-observed", percentile([s * 1000 for s in latencies], 0.99), "ms"),
    ]


async def _timekeeper_beside(server: Server, section: Section, hostile: Hostile, label: str) -> None:
    """Reports and reads on new connections, about 2 a second for 10 s, beside `hostile`; how many of its
    connections are open 30 s after they were opened."""
    port = int(server.url.rsplit(":", 1)[1])
    section.notes.append(f"{label}: {_load()} before")
    latencies: list[float] = []
    measured = good_timekeeper_requests(port, server.token, server.reader, latencies)
    outcomes, seen = await beside_hostile(hostile, measured, 20, interval=0.5)
    _passed(section, f"{label}: reports and reads on new connections", outcomes, latencies)
    section.figures.append(
        Figure(f"{label}: open 30 s after", 100 * seen.still_open[0] / seen.made, "%", target="≤ 10 %")
    )


async def _timekeeper_trailers(server: Server, section: Section) -> None:
    """A 64 MiB chunked trailer on a report beside a /healthz, then a 96 MiB one."""
    port = int(server.url.rsplit(":", 1)[1])
    section.notes.append(f"timekeeper trailers: {_load()} before")
    head = (
        "POST /api/v1/reports HTTP/1.1\r\nHost: timekeeper\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {server.token}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    healthz = b"GET /api/v1/healthz HTTP/1.1\r\nHost: timekeeper\r\nConnection: close\r\n\r\n"
    trailer = asyncio.ensure_future(huge_trailer(port, 64 * MIB, head))
    await asyncio.sleep(0.05)
    began = time.perf_counter()
    status = await plain_request(port, healthz, 10)
    beside = time.perf_counter() - began
    answered, sent, seconds = await trailer
    _, sent_96, seconds_96 = await huge_trailer(port, 96 * MIB, head)
    section.figures += [
        Figure("a 64 MiB trailer at the timekeeper: closed after", seconds * 1000, "ms", target="< 5,000 ms"),
        Figure(f"/healthz beside it (answered {status})", beside * 1000, "ms", target="< 1,000 ms"),
        Figure("a 96 MiB trailer at the timekeeper: closed after", seconds_96 * 1000, "ms"),
    ]
    first = answered.split(b"\r\n", 1)[0].decode() or "reset first"
    section.notes.append(
        f"64 MiB trailer: `{first}` after {sent / MIB:.1f} MiB sent; 96 MiB: after {sent_96 / MIB:.1f} MiB"
    )


async def _webhook_beside(target: Target, section: Section, hostile: Hostile, label: str, count: int) -> None:
    """GPU-pod admissions on new TLS connections, about 2 a second, beside `hostile`."""
    section.notes.append(f"{label}: {_load()} before")
    normal = orjson.dumps(review(pod(container("main", {"nvidia.com/gpu": 1}))))
    patience = api_server_timeout_seconds()
    latencies: list[float] = []

    async def admission() -> bool:
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            status, seconds = await asyncio.wait_for(target.post("/mutate", normal), patience)
            latencies.append(seconds)
            return status == 200
        return False

    outcomes, seen = await beside_hostile(hostile, admission, count, interval=0.5)
    _passed(section, f"{label}: admissions on new connections within {patience:g} s", outcomes, latencies)
    if hostile.checks:
        section.figures.append(
            Figure(f"{label}: open {hostile.checks[0]:g} s after", 100 * seen.still_open[0] / seen.made, "%")
        )
    section.notes.append(f"{label}: {seen.made:,} hostile connections made")


async def _webhook_trailers(target: Target, section: Section) -> None:
    """8 x 48 MiB chunked trailers on /mutate from one address, an admission beside them."""
    section.notes.append(f"webhook trailers: {_load()} before")
    at_rest, _ = _memory(target.pid)
    head = b"POST /mutate HTTP/1.1\r\nHost: webhook\r\nTransfer-Encoding: chunked\r\n\r\n"
    normal = orjson.dumps(review(pod(container("main", {"nvidia.com/gpu": 1}))))
    trailers = asyncio.gather(*(huge_trailer(target.port, 48 * MIB, head, target.context) for _ in range(8)))
    await asyncio.sleep(0.05)
    status, beside = await target.post("/mutate", normal)
    worst = max(seconds for _, _, seconds in await trailers)
    section.figures += [
        Figure(
            "8 x 48 MiB trailers at the webhook: closed after, worst", worst * 1000, "ms", target="< 5,000 ms"
        ),
        Figure(f"an admission beside them (answered {status})", beside * 1000, "ms"),
    ]
    _memory_figures(section, "8 x 48 MiB trailers", target, at_rest)


async def _at_rest(server: Server, target: Target, count: int) -> tuple[list[float], list[float]]:
    """(report latencies, admission latencies) in seconds: `count` of each, one after another, each on a
    new connection, with no attack."""
    port = int(server.url.rsplit(":", 1)[1])
    reports: list[float] = []
    measured = good_timekeeper_requests(port, server.token, server.reader, reports)
    admissions = []
    normal = orjson.dumps(review(pod(container("main", {"nvidia.com/gpu": 1}))))
    for _ in range(count):
        await measured()
        await measured()  # a report, then a read: only the reports' times are kept
        reports.pop()
        admissions.append((await target.post("/mutate", normal))[1])
    return reports, admissions


def _cost_at_rest(section: Section, baseline: Path, rounds: int = 2, count: int = 200) -> None:
    """Admission and report p99 with no attack, served from `baseline` and from here in turn."""
    timings: dict[str, tuple[list[float], list[float]]] = {"baseline": ([], []), "this change": ([], [])}
    for _ in range(rounds):
        for name, tree in (("baseline", baseline), ("this change", None)):
            section.notes.append(f"cost at rest, {name}: {_load()} before")
            settings = image_malloc_env("timekeeper")
            with (
                timekeeper(settings=settings, command=_command("timekeeper", tree)) as server,
                tempfile.TemporaryDirectory() as scratch,
                _webhook(Path(scratch), tree) as target,
            ):
                reports, admissions = asyncio.run(_at_rest(server, target, count))
            timings[name][0].extend(reports)
            timings[name][1].extend(admissions)
    for index, what in enumerate(("a report", "an admission")):
        before = percentile([s * 1000 for s in timings["baseline"][index]], 0.99)
        after = percentile([s * 1000 for s in timings["this change"][index]], 0.99)
        section.figures.append(
            Figure(
                f"{what} at rest, new connection, p99", after, "ms", baseline=before, baseline_name="baseline"
            )
        )
    section.notes.append(
        f"cost at rest: {rounds} rounds of {count} reports (and as many reads) and {count} admissions, each"
        " on a new connection, one after another, from the baseline tree and from this one in turn"
    )


def run_issue_38(baseline: Path | None = None) -> Section:
    """Issue #38's probes: a tenant's many addresses, answers before bodies, huge trailers."""
    section = Section("Hostile clients from many addresses (issue #38)")
    settings = image_malloc_env("timekeeper")  # as its image runs it
    with timekeeper(settings=settings) as server:
        port = int(server.url.rsplit(":", 1)[1])
        at_rest, _ = _memory(server.pids[0])
        slow = Hostile("slow_heads", port, 1000, hostile_sources(10), checks=(30.0,))
        slow = dataclasses.replace(slow, head=b"POST /api/v1/reports HTTP/1.1\r\nHost: timekeeper\r\n")
        asyncio.run(_timekeeper_beside(server, section, slow, "1,000 slow heads from 10 addresses"))
        answered = Hostile(
            "answer_before_body",
            port,
            1000,
            hostile_sources(5),
            head=b"POST /api/v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2\r\n\r\n",
            body=b"{}",
            checks=(30.0,),
        )
        asyncio.run(
            _timekeeper_beside(server, section, answered, "1,000 answered before their body, 5 addresses")
        )
        asyncio.run(_timekeeper_trailers(server, section))
        rss, peak = _memory(server.pids[0])
        section.figures.append(
            Figure(
                "timekeeper RSS after these attacks", rss, "MiB", baseline=at_rest, baseline_name="at rest"
            )
        )
        section.notes.append(
            f"timekeeper peak RSS {peak:.0f} MiB (`MALLOC_MMAP_THRESHOLD_` as its image sets it)"
        )
        section.notes.append(f"timekeeper /metrics after: {_connections_refused(server)}")
    probes: list[Callable[[Target], Coroutine[Any, Any, None]]] = [
        lambda target: _webhook_beside(
            target,
            section,
            Hostile("trickle", target.port, 150, hostile_sources(10), ca_pem=target.ca_pem),
            "150 slow TLS clients from 10 addresses, 30 s",
            60,
        ),
        lambda target: _webhook_beside(
            target,
            section,
            Hostile(
                "answer_before_body",
                target.port,
                100,
                hostile_sources(2),
                ca_pem=target.ca_pem,
                head=b"GET /healthz HTTP/1.1\r\nHost: webhook\r\nContent-Length: 1\r\n\r\n",
                body=b"x",
                checks=(35.0,),
            ),
            "100 answered before their body, 2 addresses",
            20,
        ),
        lambda target: _webhook_trailers(target, section),
    ]
    for probe in probes:
        with tempfile.TemporaryDirectory() as scratch, _webhook(Path(scratch)) as target:
            asyncio.run(probe(target))
    if baseline is not None:
        _cost_at_rest(section, baseline)
    section.notes.append(f"{_load()} after (a shared 2-core machine)")
    return section


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
    parser.add_argument("--baseline", type=Path, help="a checkout to measure the cost at rest against")
    parser.add_argument("--only", choices=("20", "27", "38"), help="only this issue's probes")
    args = parser.parse_args()
    runs = {
        "20": lambda: run(args.slow, args.wait),
        "27": run_issue_27,
        "38": lambda: run_issue_38(args.baseline),
    }
    sections = [probe() for issue, probe in runs.items() if args.only in (None, issue)]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    write_results(sections, OUT)
    print(OUT.read_text())


if __name__ == "__main__":
    main()
