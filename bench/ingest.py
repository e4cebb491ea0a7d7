"""Timekeeper benchmarks: report ingest, budget reads and the admission snapshot against `python -m
timekeeper` on a private production-configured PostgreSQL, under wrk, beside the bare ASGI endpoint and a
bare INSERT + COMMIT loop. Run: `python -m bench.ingest [--seconds 10]`; writes bench/out/ingest.md."""

from __future__ import annotations

import argparse
import hashlib
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import httpx
import psycopg
from sqlalchemy.engine import URL

from bench.baseline_db import insert_commit_rate
from bench.common import (
    PYTHON,
    REPO_ROOT,
    Figure,
    Section,
    free_port,
    fresh_database,
    percentile,
    postgres_server,
    postgres_settings_note,
    process,
    progress,
    write_results,
)
from bench.wrk import WrkResult, combine, one_after_another, run_wrk
from tests.support.postgres import url_string

OUT = REPO_ROOT / "bench" / "out" / "ingest.md"
UVICORN_OPTIONS = ["--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"]
NAMESPACES = 10_000
POISON_PER_SECOND = 10
PODS_PER_CLIENT = 2000  # each wrk's pods (bench/reports.lua): a round of reports is one report per pod
WARM_UP_SECONDS = 2  # of each round's load before its measured part (a timekeeper runs for days)
# What issue #20's probe sent: a report dated before year 1 in UTC (it answered 500 and made its whole batch
# be charged again one report at a time) and one whose repeated key would have charged a share of 200.
POISON = (
    b'{"namespace":"bench-0","pod":"poison","pod_uid":"poison-0","seq":1,'
    b'"interval_start":"0001-01-01T00:00:00+01:00","interval_end":"0001-01-01T00:00:30+01:00",'
    b'"gpu_share":0.5}',
    b'{"namespace":"bench-0","pod":"poison","pod_uid":"poison-1","seq":1,'
    b'"interval_start":"%s","interval_end":"%s","gpu_share":0.5,"gpu_share":200}',
)


@dataclass(frozen=True)
class Server:
    urls: list[str]  # one per timekeeper process (replica), all on the same database
    token: str  # the reporter's
    reader: str  # an admin's, for the reads
    dsn: str
    pids: Sequence[int] = ()  # one per timekeeper process

    @property
    def url(self) -> str:
        return self.urls[0]


@contextmanager
def timekeeper(
    workers: int = 1,
    replicas: int = 1,
    settings: dict[str, str] | None = None,
    server: URL | None = None,
    command: Sequence[str] = (PYTHON, "-m", "timekeeper"),
) -> Iterator[Server]:
    """`python -m timekeeper` (`replicas` processes, each with `workers` workers, `settings` added to their
    environment) on a fresh migrated database of `server` (None: a private server of its own), with a
    reporter and an admin token made for this run; `command` runs it from another checkout."""
    token, reader = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    digest = hashlib.sha256(token.encode()).hexdigest()
    admin_digest = hashlib.sha256(reader.encode()).hexdigest()
    with ExitStack() as processes:
        if server is None:
            server = processes.enter_context(postgres_server())
        url = processes.enter_context(fresh_database(server, f"gtk_bench_{secrets.token_hex(6)}"))
        env = {
            "TIMEKEEPER_DATABASE_URL": url_string(url),
            "TIMEKEEPER_ADMIN_TOKEN_SHA256": admin_digest,
            "TIMEKEEPER_REPORTER_TOKEN_SHA256": digest,
            **(settings or {}),
        }
        urls, pids = [], []
        for _ in range(replicas):
            port = free_port()
            args = [*command, "--port", str(port), "--workers", str(workers)]
            child = processes.enter_context(
                process([*args, "--no-access-log", "--log-level", "warning"], env=env, port=port)
            )
            urls.append(f"http://127.0.0.1:{port}")
            pids.append(child.pid)
        yield Server(urls, token, reader, url_string(url.set(drivername="postgresql")), pids)


@contextmanager
def bare_asgi() -> Iterator[str]:
    port = free_port()
    args = [PYTHON, "-m", "uvicorn", "bench.bare_asgi:app", "--host", "127.0.0.1", "--port", str(port)]
    with process([*args, *UVICORN_OPTIONS], port=port):
        yield f"http://127.0.0.1:{port}"


def _base() -> int:
    """Where a load's intervals start: two hours ago, so even the last of them ends in the past (no
    clock-skew refusals)."""
    return int(time.time()) - 2 * 3600


def _reports(
    urls: list[str], token: str, seconds: int, connections: int, base: int | None = None
) -> WrkResult:
    """Report load split evenly over the given servers, one wrk per server, run at the same time; each
    wrk's pods report in rounds of PODS_PER_CLIENT, round n covering [base + 30 s n, base + 30 s (n + 1))."""
    base = _base() if base is None else base
    arguments = [[str(base), str(PODS_PER_CLIENT), token, "100", str(client)] for client in range(len(urls))]
    return _across(urls, "reports.lua", arguments, seconds, connections)


def _across(
    urls: list[str], script: str, arguments: list[list[str]], seconds: int, connections: int
) -> WrkResult:
    """One wrk per server (with the script arguments of the same index), the connections split evenly,
    run at the same time: the load a Service spreading clients over the replicas would give them."""
    share = max(1, connections // len(urls))
    with ThreadPoolExecutor(len(urls)) as pool:
        runs = [
            pool.submit(run_wrk, url, script, args, seconds=seconds, connections=share)
            for url, args in zip(urls, arguments, strict=True)
        ]
        return combine([run.result() for run in runs])


@contextmanager
def _poison(urls: list[str], token: str) -> Iterator[Counter[int]]:
    """POISON_PER_SECOND poison reports a second, spread over the servers, while the block runs; the
    counter collects their status codes."""
    stop = threading.Event()
    codes: Counter[int] = Counter()
    now = time.time()
    stamps = tuple(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 3600 + d)).encode() for d in (0, 30))

    def send() -> None:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        with httpx.Client(headers=headers) as client:
            sent = 0
            started = time.monotonic()
            while not stop.is_set():
                body = POISON[0] if sent % 2 == 0 else POISON[1] % stamps
                codes[client.post(f"{urls[sent % len(urls)]}/api/v1/reports", content=body).status_code] += 1
                sent += 1
                stop.wait(max(0.0, started + sent / POISON_PER_SECOND - time.monotonic()))

    sender = threading.Thread(target=send, name="poison")
    sender.start()
    try:
        yield codes
    finally:
        stop.set()
        sender.join()


WEIGHTED_MODELS = ["NVIDIA-H100-80GB-HBM3", *(f"MODEL-{n}" for n in range(19))]
# Where the weights change, in seconds from the load's first interval start: 4 h and 2 h before it, at it,
# twice inside it, when the load runs (base + 2 h: now) and ten minutes ahead. Each pod reports in 30 s
# rounds, so the changes at 15 s and 75 s fall inside its first and third report: every weighted round
# splits reports at a weight change (the third round is reached at 800 reports/s over 10 s).
WEIGHT_CHANGES = (-4 * 3600, -2 * 3600, 0, 15, 75, 2 * 3600, 2 * 3600 + 600)


def set_weights(dsn: str, base: float, offsets: Sequence[float] = WEIGHT_CHANGES) -> None:
    """Billing weights as a cluster would keep them, generously: 20 GPU models (the reports' among them),
    each changed at base + each offset (docs/billing.md), to weights 2.5, 3, 3.5, 2, 2.5, ... in turn."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(
            "INSERT INTO gpu_weights (model, effective_from, weight, set_by) "
            "SELECT m, to_timestamp(%s + o), 2 + (i %% 4) * 0.5, 'bench' "
            "FROM unnest(%s::text[]) AS m, unnest(%s::float8[]) WITH ORDINALITY AS x(o, i)",
            (base, WEIGHTED_MODELS, list(offsets)),
        )


def _seed_namespaces(dsn: str, count: int) -> None:
    """`count` known namespaces with states, as a cluster of that size would have."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(
            "INSERT INTO namespace_status (namespace, state) "
            "SELECT 'seeded-' || i, CASE WHEN i %% 7 = 0 THEN 'exhausted' ELSE 'in_budget' END "
            "FROM generate_series(1, %s) AS i ON CONFLICT DO NOTHING",
            (count,),
        )


def _snapshot_latencies(server: Server, samples: int) -> tuple[list[float], list[float], int]:
    """Full snapshots one at a time, in milliseconds: each right after a version bump (the document is built)
    and again at the unchanged version (what further replicas polling get); and the body size."""
    headers = {"Authorization": f"Bearer {server.reader}"}
    built: list[float] = []
    unchanged: list[float] = []
    size = 0
    with (
        httpx.Client(base_url=server.url, headers=headers) as client,
        psycopg.connect(server.dsn, autocommit=True) as database,
    ):
        for index in range(samples + 5):
            database.execute("UPDATE admission_version SET version = version + 1")
            for timings in (built, unchanged):
                started = time.perf_counter()
                response = client.get("/api/v1/admission-state")
                elapsed = (time.perf_counter() - started) * 1000
                response.raise_for_status()
                size = len(response.content)
                if index >= 5:  # the first few warm the connection pool and the plan cache
                    timings.append(elapsed)
    return built, unchanged, size


# The variants compared with the plain load, and the order of the rounds: each round on a fresh migrated
# database with fresh timekeeper processes, so no variant inherits another's ledger rows, autovacuum or
# checkpoint; interleaved A B C C B A so a drift over the run (later runs were slower, whatever they were)
# weighs on every variant alike.
PLAIN, WEIGHTED, POISONED = "without weights or poison", "with billing weights", "with poison"
ROUNDS = (PLAIN, WEIGHTED, POISONED, POISONED, WEIGHTED, PLAIN)


def _crossing(result: WrkResult, clients: int, offsets: Sequence[float] = WEIGHT_CHANGES) -> int:
    """How many of a weighted round's reports had a weight change strictly inside their interval (each
    client's round n covers [base + 30 s n, base + 30 s (n + 1)))."""
    per_client = result.requests // clients
    crossing = 0
    for offset in offsets:
        if offset > 0 and offset % 30:
            done = per_client - int(offset // 30) * PODS_PER_CLIENT
            crossing += clients * max(0, min(PODS_PER_CLIENT, done))
    return crossing


def run(seconds: int = 10, connections: int = 64, workers: int = 1, replicas: int = 2) -> list[Section]:
    with postgres_server() as server:
        return _run(server, seconds, connections, workers, replicas)


def _run(server_url: URL, seconds: int, connections: int, workers: int, replicas: int) -> list[Section]:
    light = max(1, connections // 4)
    with bare_asgi() as url:
        progress(f"ingest: bare ASGI baseline, {seconds}s of reports and {seconds}s of GETs")
        bare = _reports([url], "unused", seconds, connections)
        bare_get = run_wrk(url, "get.lua", ["unused", "/"], seconds=seconds, connections=2)
    rounds: list[tuple[str, WrkResult]] = []
    poison_codes: Counter[int] = Counter()
    crossing = 0
    for number, variant in enumerate(ROUNDS, 1):
        with timekeeper(workers, replicas, server=server_url) as server:
            if number == 1:
                progress("ingest: bare INSERT+COMMIT baseline")
                db_rate = insert_commit_rate(server.dsn, connections=16, seconds=seconds / 2)
            progress(
                f"ingest round {number}/{len(ROUNDS)} (fresh database), {variant}: "
                f"{connections} clients, {seconds}s"
            )
            base = _base()
            # Not measured: the pods' first reports (their rows created) and psycopg's prepared
            # statements, an hour of report time before the measured load (no measured report repeats one).
            _reports(server.urls, server.token, WARM_UP_SECONDS, connections, base - 3600)
            if variant == WEIGHTED:
                set_weights(server.dsn, base)
                result = _reports(server.urls, server.token, seconds, connections, base)
                crossing += _crossing(result, len(server.urls))
            elif variant == POISONED:
                with _poison(server.urls, server.token) as codes:
                    result = _reports(server.urls, server.token, seconds, connections, base)
                poison_codes += codes
            else:
                result = _reports(server.urls, server.token, seconds, connections, base)
            rounds.append((variant, result))
            if number < len(ROUNDS):
                continue
            progress(f"ingest: {light} clients, {seconds}s")
            lighter = _reports(server.urls, server.token, seconds, light)
            _seed_namespaces(server.dsn, NAMESPACES)
            progress(f"budget reads, {seconds}s; admission snapshots")
            paths = ",".join(f"/api/v1/namespaces/bench-{i}/budget" for i in range(100))
            read_arguments = [server.reader, paths]
            reads = _across(server.urls, "get.lua", [read_arguments] * len(server.urls), seconds, 2)
            one_replica_reads = run_wrk(server.url, "get.lua", read_arguments, seconds=seconds, connections=2)
            snapshot, unchanged_snapshot, snapshot_bytes = _snapshot_latencies(server, 200)
    ingest, weighted, poisoned = (
        one_after_another([result for name, result in rounds if name == variant])
        for variant in (PLAIN, WEIGHTED, POISONED)
    )
    for name, result in (
        ("ingest", ingest),
        ("ingest", lighter),
        ("ingest with poison", poisoned),
        ("ingest with weights", weighted),
        ("bare ASGI", bare),
        ("budget reads", reads),
        ("budget reads, one replica", one_replica_reads),
    ):
        if result.errors:
            raise RuntimeError(f"{name}: {result.errors} errors under load")
    ingest_section = Section(
        "Timekeeper report ingest",
        [
            Figure(
                "reports/s acknowledged after commit",
                ingest.rate,
                "reports/s",
                target="≥ 3,000 reports/s",
                baseline=bare.rate,
                baseline_name="bare ASGI, same uvicorn, same wrk script",
            ),
            Figure(
                "reports/s vs. the database's bare commit rate",
                ingest.rate,
                "reports/s",
                baseline=db_rate,
                baseline_name="bare INSERT+COMMIT, 16 connections",
            ),
            Figure("ingest p50", ingest.p50_ms, "ms", baseline=bare.p50_ms, baseline_name="bare ASGI p50"),
            Figure(
                "ingest p99",
                ingest.p99_ms,
                "ms",
                target="< 50 ms",
                baseline=bare.p99_ms,
                baseline_name="bare ASGI p99",
            ),
            Figure(
                f"good reports/s with {POISON_PER_SECOND} poison reports/s mixed in",
                poisoned.rate,
                "reports/s",
                target="within 10 % of without",
                baseline=ingest.rate,
                baseline_name="the same load without poison, the mean of this run's rounds",
            ),
            Figure("ingest p99 with poison mixed in", poisoned.p99_ms, "ms", target="< 50 ms"),
            Figure(
                "reports/s with billing weights set",
                weighted.rate,
                "reports/s",
                target="within 10 % of without",
                baseline=ingest.rate,
                baseline_name="the same load without weights, the mean of this run's rounds",
            ),
            Figure("ingest p99 with billing weights set", weighted.p99_ms, "ms", target="< 50 ms"),
            Figure(f"reports/s with {light} clients", lighter.rate, "reports/s"),
            Figure(f"ingest p50 with {light} clients", lighter.p50_ms, "ms"),
            Figure(f"ingest p99 with {light} clients", lighter.p99_ms, "ms", target="< 50 ms"),
        ],
        [
            f"wrk, 1 thread, {connections} keep-alive connections ({connections} sidecar-like clients"
            f" reporting back to back), {seconds}s; every report is distinct (2,000 pods in 100 namespaces,"
            " contiguous 30 s intervals), so each one charges and commits",
            f"{replicas} x `python -m timekeeper --workers {workers}` (replicas on one database, each"
            f" driven by its own wrk with {connections // replicas} of the connections); PostgreSQL on the"
            " same machine",
            postgres_settings_note(),
            f"rounds, each on a fresh migrated database and fresh timekeeper processes, each measured after"
            f" {WARM_UP_SECONDS}s of the same load an hour of report time earlier (the pods' first reports,"
            " psycopg's prepared statements: a timekeeper runs for days), in this order: "
            + "; ".join(f"{n}. {name} {result.rate:,.0f}/s" for n, (name, result) in enumerate(rounds, 1))
            + f"; the figures above are each variant's mean over its {ROUNDS.count(PLAIN)} rounds (p50 and"
            f" p99: its worst round); without {ingest.rate:,.0f}/s, with weights {weighted.rate:,.0f}/s"
            f" ({weighted.rate / ingest.rate:.2f}x), with poison {poisoned.rate:,.0f}/s"
            f" ({poisoned.rate / ingest.rate:.2f}x); the {light}-client run, the reads and the snapshots ran"
            " in the last round's timekeeper after its load",
            f"{ingest.requests + poisoned.requests + lighter.requests + weighted.requests:,} reports"
            " acknowledged, 0 errors",
            "billing weights: the reports name their GPU (NVIDIA H100 80GB HBM3); the weighted rounds have"
            " weights for 20 models, each changed 4 h and 2 h before the load's first interval, at it, 15 s"
            " and 75 s into it, at the time the load runs and 10 min ahead; the changes inside the load's"
            f" time split {crossing:,} of the weighted rounds' {weighted.requests:,} reports (each pod's"
            " first and third) at a weight change",
            f"poison: {sum(poison_codes.values())} reports at {POISON_PER_SECOND}/s beside the load (a report"
            " dated year 1 at +01:00, and one repeating gpu_share), answered"
            f" {', '.join(f'{n} x {code}' for code, n in sorted(poison_codes.items()))}",
            f"load generator: wrk used {ingest.client_cpu_pct:.0f} % of one core against the timekeeper and"
            f" drove the bare ASGI endpoint at {bare.rate:,.0f} req/s ({bare.client_cpu_pct:.0f} % of a core)"
            " with the same script and connections, so it can offer far more load than the timekeeper took",
        ],
    )
    reads_section = Section(
        "Budget reads and the admission snapshot",
        [
            Figure(
                f"budget reads/s (2 connections over the {replicas} replicas, closed loop)",
                reads.rate,
                "req/s",
                target="≥ 1,000 req/s",
                baseline=bare_get.rate,
                baseline_name="bare ASGI GET, 2 connections",
            ),
            Figure(
                "budget read p99",
                reads.p99_ms,
                "ms",
                target="< 5 ms",
                baseline=bare_get.p99_ms,
                baseline_name="bare ASGI p99",
            ),
            Figure("budget reads/s, one replica (2 connections)", one_replica_reads.rate, "req/s"),
            Figure("budget read p99, one replica", one_replica_reads.p99_ms, "ms"),
            Figure(f"admission snapshot, {NAMESPACES:,} namespaces, p50", percentile(snapshot, 0.5), "ms"),
            Figure(
                f"admission snapshot, {NAMESPACES:,} namespaces, p99",
                percentile(snapshot, 0.99),
                "ms",
                target="< 50 ms",
            ),
            Figure(
                "admission snapshot of an unchanged version (full body), p99",
                percentile(unchanged_snapshot, 0.99),
                "ms",
            ),
        ],
        [
            "budget reads: 2 wrk connections back to back over 100 namespaces, one to each replica as a"
            " Service would spread them (plain wrk cannot hold a fixed rate); when the closed loop reaches"
            " 1,000 req/s its p99 is that of a load at least as high as the target's; this run reached"
            f" {reads.rate:,.0f} req/s; beside it both connections to one replica (one Python process)",
            f"snapshot: {len(snapshot)} full GETs of /admission-state one at a time (no If-None-Match),"
            f" {snapshot_bytes / 1024:,.0f} KiB each, timed by the client end to end, each right after the"
            " version moved (so the document is built); beside each, a second full GET of the same version"
            " (answered with the document built for the first)",
        ],
    )
    return [ingest_section, reads_section]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    sections = run(args.seconds, args.connections, args.workers, args.replicas)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    write_results(sections, OUT)
    print(OUT.read_text())


if __name__ == "__main__":
    main()
