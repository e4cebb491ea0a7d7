"""Timekeeper benchmarks: report ingest, budget reads and the admission snapshot, beside same-run baselines.

The timekeeper runs as `python -m timekeeper` (a real process) on a database of its own on the machine's
PostgreSQL (TIMEKEEPER_TEST_DATABASE_URL, else the embedded one). wrk drives the HTTP load; the bare
ASGI endpoint (bench/bare_asgi.py, same uvicorn options) is the HTTP baseline and a bare INSERT + COMMIT
loop (bench/baseline_db.py) the database baseline.

Run: `.venv/bin/python -m bench.ingest [--seconds 10]`; it prints a table and writes bench/out/ingest.md.
"""

from __future__ import annotations

import argparse
import hashlib
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import httpx
import psycopg

from bench.baseline_db import insert_commit_rate
from bench.common import PYTHON, REPO_ROOT, Figure, Section, free_port, percentile, process, write_results
from bench.wrk import WrkResult, combine, run_wrk
from tests.support.postgres import url_string
from tests.support.timekeeper import migrated_database

OUT = REPO_ROOT / "bench" / "out" / "ingest.md"
UVICORN_OPTIONS = ["--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"]
NAMESPACES = 10_000


@dataclass(frozen=True)
class Server:
    urls: list[str]  # one per timekeeper process (replica), all on the same database
    token: str
    dsn: str

    @property
    def url(self) -> str:
        return self.urls[0]


@contextmanager
def timekeeper(workers: int = 1, replicas: int = 1) -> Iterator[Server]:
    """`python -m timekeeper` (`replicas` processes, each with `workers` workers) on a fresh migrated
    database, with a reporter token made for this run."""
    token = secrets.token_urlsafe(24)
    digest = hashlib.sha256(token.encode()).hexdigest()
    with migrated_database("gtk_bench") as url, ExitStack() as processes:
        env = {
            "TIMEKEEPER_DATABASE_URL": url_string(url),
            "TIMEKEEPER_ADMIN_TOKEN_SHA256": digest,
            "TIMEKEEPER_REPORTER_TOKEN_SHA256": digest,
        }
        urls = []
        for _ in range(replicas):
            port = free_port()
            args = [PYTHON, "-m", "timekeeper", "--port", str(port), "--workers", str(workers)]
            processes.enter_context(
                process([*args, "--no-access-log", "--log-level", "warning"], env=env, port=port)
            )
            urls.append(f"http://127.0.0.1:{port}")
        yield Server(urls, token, url_string(url.set(drivername="postgresql")))


@contextmanager
def bare_asgi() -> Iterator[str]:
    port = free_port()
    args = [PYTHON, "-m", "uvicorn", "bench.bare_asgi:app", "--host", "127.0.0.1", "--port", str(port)]
    with process([*args, *UVICORN_OPTIONS], port=port):
        yield f"http://127.0.0.1:{port}"


def _reports(urls: list[str], token: str, seconds: int, connections: int) -> WrkResult:
    """Report load split evenly over the given servers, one wrk per server, run at the same time."""
    # Intervals start two hours ago, so even the last of them ends in the past (no clock-skew refusals).
    base = int(time.time()) - 2 * 3600
    share = max(1, connections // len(urls))
    with ThreadPoolExecutor(len(urls)) as pool:
        runs = [
            pool.submit(
                run_wrk,
                url,
                "reports.lua",
                [str(base), "2000", token, "100", str(client)],
                seconds=seconds,
                connections=share,
            )
            for client, url in enumerate(urls)
        ]
        return combine([run.result() for run in runs])


def _seed_namespaces(dsn: str, count: int) -> None:
    """`count` known namespaces with states, as a cluster of that size would have."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(
            "INSERT INTO namespace_status (namespace, state) "
            "SELECT 'seeded-' || i, CASE WHEN i %% 7 = 0 THEN 'exhausted' ELSE 'in_budget' END "
            "FROM generate_series(1, %s) AS i ON CONFLICT DO NOTHING",
            (count,),
        )


def _snapshot_latencies(server: Server, samples: int) -> tuple[list[float], int]:
    """Full snapshots (no If-None-Match), one at a time: milliseconds each, and the body size."""
    headers = {"Authorization": f"Bearer {server.token}"}
    timings = []
    size = 0
    with httpx.Client(base_url=server.url, headers=headers) as client:
        for index in range(samples + 5):
            started = time.perf_counter()
            response = client.get("/api/v1/admission-state")
            elapsed = (time.perf_counter() - started) * 1000
            response.raise_for_status()
            size = len(response.content)
            if index >= 5:  # the first few warm the connection pool and the plan cache
                timings.append(elapsed)
    return timings, size


def run(seconds: int = 10, connections: int = 64, workers: int = 1, replicas: int = 2) -> list[Section]:
    light = max(1, connections // 4)
    with bare_asgi() as url:
        bare = _reports([url], "unused", seconds, connections)
        bare_get = run_wrk(url, "get.lua", ["unused", "/"], seconds=seconds, connections=2)
    with timekeeper(workers, replicas) as server:
        db_rate = insert_commit_rate(server.dsn, connections=16, seconds=seconds / 2)
        ingest = _reports(server.urls, server.token, seconds, connections)
        lighter = _reports(server.urls, server.token, seconds, light)
        _seed_namespaces(server.dsn, NAMESPACES)
        paths = ",".join(f"/api/v1/namespaces/bench-{i}/budget" for i in range(100))
        reads = run_wrk(server.url, "get.lua", [server.token, paths], seconds=seconds, connections=2)
        snapshot, snapshot_bytes = _snapshot_latencies(server, 200)
    for name, result in (
        ("ingest", ingest),
        ("ingest", lighter),
        ("bare ASGI", bare),
        ("budget reads", reads),
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
            f"{ingest.requests + lighter.requests:,} reports acknowledged, 0 errors",
            f"load generator: wrk used {ingest.client_cpu_pct:.0f} % of one core against the timekeeper and"
            f" drove the bare ASGI endpoint at {bare.rate:,.0f} req/s ({bare.client_cpu_pct:.0f} % of a core)"
            " with the same script and connections, so it can offer far more load than the timekeeper took",
        ],
    )
    reads_section = Section(
        "Budget reads and the admission snapshot",
        [
            Figure(
                "budget reads/s (2 connections, closed loop)",
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
            Figure(f"admission snapshot, {NAMESPACES:,} namespaces, p50", percentile(snapshot, 0.5), "ms"),
            Figure(
                f"admission snapshot, {NAMESPACES:,} namespaces, p99",
                percentile(snapshot, 0.99),
                "ms",
                target="< 50 ms",
            ),
        ],
        [
            "budget reads: wrk with 2 connections back to back over 100 namespaces (plain wrk cannot hold a"
            " fixed rate); when the closed loop reaches 1,000 req/s its p99 is that of a load at least as"
            f" high as the target's; this run reached {reads.rate:,.0f} req/s",
            f"snapshot: {len(snapshot)} full GETs of /admission-state one at a time (no If-None-Match),"
            f" {snapshot_bytes / 1024:,.0f} KiB each, timed by the client end to end",
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
