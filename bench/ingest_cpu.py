"""CPU seconds per acknowledged report under `make bench`'s ingest load, by process (timekeepers, the
PostgreSQL backends and the cluster's background processes, wrk) and, with pg_stat_statements loaded
(`--statements`), by statement: a figure other load moves far less than throughput."""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Iterable
from contextlib import ExitStack
from typing import Any

import httpx
import psycopg

from bench.common import POSTGRES_SETTINGS, postgres_server
from bench.ingest import Server, _base, _reports, timekeeper

_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pids: Iterable[int], kernel: bool | None = None) -> float:
    """User + system time of the processes (those that exited meanwhile count 0); only the system
    time with kernel=True, only the user time with kernel=False."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except FileNotFoundError:
            continue
        user, system = int(fields[11]), int(fields[12])
        total += system if kernel else user if kernel is False else user + system
    return total / _TICKS


def _batches(urls: Iterable[str], reader: str) -> tuple[float, float]:
    """Reports and batches charged so far, all replicas together (their `timekeeper_ingest_batch_reports`)."""
    reports = batches = 0.0
    for url in urls:
        scrape = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {reader}"}, timeout=10)
        scrape.raise_for_status()
        for line in scrape.text.splitlines():
            name, _, value = line.partition(" ")
            if name == "timekeeper_ingest_batch_reports_sum":
                reports += float(value)
            elif name == "timekeeper_ingest_batch_reports_count":
                batches += float(value)
    return reports, batches


def _database_pids(connection: psycopg.Connection[Any]) -> tuple[list[int], list[int]]:
    """The backends of this database, and the cluster's background processes."""
    rows = connection.execute(
        "SELECT pid, datname = current_database(), backend_type FROM pg_stat_activity"
    ).fetchall()
    backends = [pid for pid, ours, kind in rows if ours and kind == "client backend"]
    background = [pid for pid, _, kind in rows if kind not in ("client backend", "autovacuum worker")]
    return backends, background


def _statements(connection: psycopg.Connection[Any]) -> list[tuple[str, int, float]] | None:
    try:
        return [
            (str(query), int(calls), float(total))
            for query, calls, total in connection.execute(
                "SELECT query, calls, total_exec_time + total_plan_time FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "ORDER BY 3 DESC"
            )
        ]
    except psycopg.Error:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--statements", action="store_true", help="load pg_stat_statements: per statement")
    args = parser.parse_args()
    with ExitStack() as stack:
        database = None
        if args.statements:
            preload = {**POSTGRES_SETTINGS, "shared_preload_libraries": "pg_stat_statements"}
            database = stack.enter_context(postgres_server(preload))
        measure(args, stack.enter_context(timekeeper(workers=1, replicas=args.replicas, server=database)))


def measure(args: argparse.Namespace, server: Server) -> None:
    """The load's CPU per report on `server`'s timekeepers and database, printed."""
    ports = [url.rsplit(":", 1)[1] for url in server.urls]
    pids = [
        int(found)
        for port in ports
        for found in subprocess.run(
            ["pgrep", "-f", f"timekeeper --port {port}"], capture_output=True, text=True, check=True
        ).stdout.split()
    ]
    # warm-up (pods created, plans cached) an hour before the load, so no measured report repeats one
    _reports(server.urls, server.token, 2, args.connections, _base() - 3600)
    with psycopg.connect(server.dsn, autocommit=True) as connection:
        statements = connection.execute("SELECT to_regclass('pg_stat_statements')").fetchone()
        tracked = statements is not None and statements[0] is not None
        if not tracked:
            try:
                connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                tracked = True
            except psycopg.Error:
                tracked = False
        if tracked:
            try:
                connection.execute("SELECT pg_stat_statements_reset()")
            except psycopg.Error:
                tracked = False
        backends, background = _database_pids(connection)
        own = [pid for (pid,) in [connection.execute("SELECT pg_backend_pid()").fetchone() or (0,)]]
        backends = [pid for pid in backends if pid not in own]
        before = (
            _cpu_seconds(pids),
            _cpu_seconds(pids, kernel=True),
            _cpu_seconds(backends),
            _cpu_seconds(backends, kernel=True),
            _cpu_seconds(background),
        )
        charged = _batches(server.urls, server.reader)
        started = time.monotonic()
        load = _reports(server.urls, server.token, args.seconds, args.connections)
        elapsed = time.monotonic() - started
        after = (
            _cpu_seconds(pids),
            _cpu_seconds(pids, kernel=True),
            _cpu_seconds(backends),
            _cpu_seconds(backends, kernel=True),
            _cpu_seconds(background),
        )
        found = _statements(connection) if tracked else None
        (reports_after, batches_after) = _batches(server.urls, server.reader)
        batched, batches = reports_after - charged[0], batches_after - charged[1]
    reports = load.requests
    timekeepers, timekeepers_kernel, database, database_kernel, cluster = (
        1e6 * (b - a) / reports for a, b in zip(before, after, strict=True)
    )
    client = 1e6 * load.client_cpu_seconds / reports
    print(
        f"{reports:,} reports in {elapsed:.1f} s ({load.rate:,.0f}/s, p99 {load.p99_ms:.0f} ms, "
        f"{load.errors} errors), load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{batched / max(batches, 1):.1f} reports per batch ({batches:,.0f} batches)")
    print("CPU per acknowledged report (µs):")
    print(f"  timekeepers          {timekeepers:7.0f}  (of which in the kernel {timekeepers_kernel:.0f})")
    print(f"  PostgreSQL backends  {database:7.0f}  (of which in the kernel {database_kernel:.0f})")
    print(f"  PostgreSQL cluster   {cluster:7.0f}  (background processes: WAL writer, checkpointer ...)")
    print(f"  wrk                  {client:7.0f}")
    total = timekeepers + database + cluster + client
    print(f"  all                  {total:7.0f}  -> {2e6 / total:,.0f} reports/s on 2 cores (kernel aside)")
    if found is None:
        print("(pg_stat_statements is not loaded in this cluster: no per-statement figures)")
        return
    per_batch = sum(calls for _, calls, _ in found) / max(batches, 1)
    print(f"{per_batch:.1f} statements per batch (BEGIN and COMMIT included)")
    print("\nPostgreSQL time per report by statement (µs; planning + execution), calls per 1,000 reports:")
    for query, calls, milliseconds in found[: args.top]:
        text = " ".join(query.split())
        print(f"  {1000 * milliseconds / reports:7.1f}  {1000 * calls / reports:7.1f}  {text[:110]}")


if __name__ == "__main__":
    main()
