"""CPU per budget read and per admission snapshot, in-process against a real PostgreSQL: this process's CPU,
the backends' CPU, the round trips and the body size per request, a figure that holds on a busy machine
(docs/performance.md, "Reads"). A database of its own is created and dropped. `--callgrind`: exact
instructions per budget read in this process (PostgreSQL's aside), in all and by part."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import os
import pstats
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastapi.routing
import psycopg
from psycopg._connection_base import BaseConnection
from psycopg._pipeline_base import BasePipeline
from sqlalchemy.dialects.postgresql.psycopg import PGDialectAsync_psycopg
from sqlalchemy.engine import URL

import timekeeper.auth.dependencies
from bench import callgrind
from bench.common import asgi_caller
from tests.support.postgres import url_string
from tests.support.timekeeper import migrated_database, sha256
from timekeeper.app import create_app
from timekeeper.settings import Settings

BUDGET_NAMESPACES = 100


@dataclass
class RouteCost:
    name: str
    process_us: float
    database_us: float | None
    round_trips: float
    body_bytes: int

    def line(self) -> str:
        database = "n/a" if self.database_us is None else f"{self.database_us:,.0f} µs"
        return (
            f"{self.name}: {self.process_us:,.0f} µs process CPU, {database} PostgreSQL CPU, "
            f"{self.round_trips:.2f} round trips, {self.body_bytes:,} bytes per request"
        )


def seed(dsn: str, namespaces: int, pods: int = 0) -> None:
    """Budget namespaces with budgets, totals and a grant, and `namespaces` known namespaces with states
    (every 7th exhausted); with `pods`, each budget namespace's pods reporting every 30 s over the
    forecast's window."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        if pods:
            connection.execute(
                "INSERT INTO usage_ledger (namespace, pod, pod_uid, seq, interval_start, interval_end,"
                " gpu_share, charged, gpu_minutes, final, gpus, charge_share)"
                " SELECT 'bench-' || n, 'pod-' || p, 'uid-' || n || '-' || p, s,"
                " t - interval '30 seconds', t, 1, tstzmultirange(tstzrange(t - interval '30 seconds', t)),"
                " 0.5, false, '[]', 1 FROM generate_series(0, %s) AS n, generate_series(1, %s) AS p,"
                " generate_series(0, 719) AS s,"
                " LATERAL (SELECT now() - s * interval '30 seconds' AS t) AS at",
                (BUDGET_NAMESPACES - 1, pods),
            )
            if connection.execute("SELECT to_regclass('usage_burn')").fetchone() != (None,):
                connection.execute(
                    "INSERT INTO usage_burn (namespace, bucket_start, gpu_minutes) SELECT namespace,"
                    " date_bin(interval '5 minutes', interval_start, timestamptz '1970-01-01 00:00:00+00'),"
                    " sum(gpu_minutes) FROM usage_ledger GROUP BY 1, 2"
                )
            connection.execute("ANALYZE")
        connection.execute(
            "INSERT INTO namespace_budgets (namespace, budget_gpu_minutes, period, warn_at_fraction,"
            " updated_at, updated_by) SELECT 'bench-' || i, 1000000, 'monthly', 0.8, now(), 'bench'"
            " FROM generate_series(0, %s) AS i",
            (BUDGET_NAMESPACES - 1,),
        )
        connection.execute(
            "INSERT INTO usage_totals (namespace, period_kind, period_start, used_gpu_minutes,"
            " granted_gpu_minutes) SELECT 'bench-' || i, 'monthly', date_trunc('month', now()), 12.5, 1"
            " FROM generate_series(0, %s) AS i",
            (BUDGET_NAMESPACES - 1,),
        )
        connection.execute(
            "INSERT INTO namespace_status (namespace, state) SELECT 'bench-' || i, 'in_budget'"
            " FROM generate_series(0, %s) AS i",
            (BUDGET_NAMESPACES - 1,),
        )
        connection.execute(
            "INSERT INTO namespace_status (namespace, state) "
            "SELECT 'seeded-' || i, CASE WHEN i %% 7 = 0 THEN 'exhausted' ELSE 'in_budget' END "
            "FROM generate_series(1, %s) AS i",
            (namespaces,),
        )


def _backend_cpu_seconds(dsn: str, database: str) -> float | None:
    """CPU used so far by the PostgreSQL backends connected to `database` (None: not readable here)."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        pids = [
            row[0]
            for row in connection.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            )
        ]
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        for pid in pids:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
    except OSError:
        return None
    return total


@contextmanager
def counted_round_trips() -> Iterator[list[int]]:
    """Counts what psycopg sends and waits for, one round trip each: statements outside a pipeline (the
    pre-ping's `;` among them), a pipeline's Syncs (`sync()`'s and its exit's alike), and
    BEGIN/COMMIT/ROLLBACK."""
    count = [0]
    execute, command = psycopg.AsyncCursor.execute, BaseConnection._exec_command
    sync = BasePipeline._enqueue_sync

    async def counted_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.connection._pipeline is None:
            count[0] += 1
        return await execute(self, *args, **kwargs)

    def counted_sync(self: Any) -> None:
        count[0] += 1
        sync(self)

    def counted_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return command(self, *args, **kwargs)

    psycopg.AsyncCursor.execute = counted_execute  # type: ignore[method-assign]
    BasePipeline._enqueue_sync = counted_sync  # type: ignore[method-assign]
    BaseConnection._exec_command = counted_command  # type: ignore[method-assign]
    try:
        yield count
    finally:
        psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]
        BasePipeline._enqueue_sync = sync  # type: ignore[method-assign]
        BaseConnection._exec_command = command  # type: ignore[method-assign]


async def profile(call: Callable[[], Awaitable[int]], requests: int, top: int) -> None:
    """cProfile's view of `requests` calls: the functions with the most time of their own, and the
    largest cumulative ones (deterministic profiling inflates small calls; read proportions)."""
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for _ in range(requests):
        await call()
    profiler.disable()
    stats = pstats.Stats(profiler)
    # Deterministic, whatever the machine's load: Python function calls per request.
    print(f"{stats.total_calls / requests:,.0f} Python function calls per request")  # type: ignore[attr-defined]
    for order in ("tottime", "cumulative"):
        stats.sort_stats(order).print_stats(top)


async def measure(
    name: str,
    call: Callable[[], Awaitable[int]],
    requests: int,
    cpu: Callable[[], float | None],
    top: int = 0,
) -> RouteCost:
    for _ in range(max(5, requests // 10)):  # warm-up: the pool, prepared statements, caches
        await call()
    if top:
        await profile(call, requests, top)
    database_before = cpu()
    with counted_round_trips() as trips:
        started = time.process_time()
        for _ in range(requests):
            await call()
        used = time.process_time() - started
    database_after = cpu()
    database = (
        None
        if database_before is None or database_after is None
        else 1e6 * (database_after - database_before) / requests
    )
    return RouteCost(name, 1e6 * used / requests, database, trips[0] / requests, await call())


async def costs(url: URL, requests: int, namespaces: int, top: int = 0, pods: int = 0) -> list[RouteCost]:
    dsn = url_string(url).replace("postgresql+psycopg://", "postgresql://")
    seed(dsn, namespaces, pods)
    token = secrets.token_urlsafe(24)
    settings = Settings(
        database_url=url_string(url), scheduler_enabled=False, reader_token_sha256=sha256(token)
    )
    app = create_app(settings)
    headers = [(b"authorization", f"Bearer {token}".encode())]

    def caller(path: str) -> Callable[[], Awaitable[int]]:
        return asgi_caller(app, path, b"", headers, method="GET")

    results = []
    async with app.router.lifespan_context(app):

        def cpu() -> float | None:
            return _backend_cpu_seconds(dsn, str(url.database))

        budget_calls = itertools.cycle(
            [caller(f"/api/v1/namespaces/bench-{i}/budget") for i in range(BUDGET_NAMESPACES)]
        )

        async def budget() -> int:
            return await next(budget_calls)()

        results.append(await measure("GET /namespaces/{ns}/budget", budget, requests, cpu, top))
        snapshot = caller("/api/v1/admission-state")
        snapshots = max(20, requests // 50)
        # The seeded states are in_budget and exhausted under an unlimited default: every namespace
        # differs from the default entry (the worst case). With a default budget, the in-budget
        # namespaces on it equal the default entry, as in a cluster where most teams are in budget.
        name = f"GET /admission-state ({namespaces:,} namespaces"
        results.append(await measure(f"{name}, all differ from the default)", snapshot, snapshots, cpu, top))
        with psycopg.connect(dsn, autocommit=True) as connection:
            connection.execute("UPDATE default_budget SET budget_gpu_minutes = 1000000")
            connection.execute("UPDATE admission_version SET version = version + 1")
        results.append(await measure(f"{name}, 1 in 7 exhausted)", snapshot, snapshots, cpu, top))
    return results


# The parts of a budget read counted one pass each (toggles do not nest): where each is reached.
READ_PARTS: dict[str, tuple[Any, str]] = {
    "dependencies_solved": (fastapi.routing, "solve_dependencies"),  # every dependency, the principal's
    "endpoint": (fastapi.routing, "run_endpoint_function"),  # get_budget: the read, its answer
    "authorize": (timekeeper.auth.dependencies, "authorize"),
    # The checkout's switch to AUTOCOMMIT and the checkin's switch back (psycopg's setters, each through
    # SQLAlchemy's greenlet bridge).
    "isolation_level_set": (PGDialectAsync_psycopg, "set_isolation_level"),
}


def _collect_reads(url: str, token: str, requests: int) -> None:
    """Run under callgrind, on a database seeded by the parent: budget reads through the ASGI app, the
    whole request once, then one part per pass."""
    settings = Settings(database_url=url, scheduler_enabled=False, reader_token_sha256=sha256(token))
    app = create_app(settings)
    headers = [(b"authorization", f"Bearer {token}".encode())]
    calls = itertools.cycle(
        [
            asgi_caller(app, f"/api/v1/namespaces/bench-{i}/budget", b"", headers, method="GET")
            for i in range(BUDGET_NAMESPACES)
        ]
    )

    async def budget() -> int:
        return await next(calls)()

    async def send(count: int, each: Callable[[], Awaitable[int]] = budget) -> None:
        for _ in range(count):
            await each()

    async def passes() -> None:
        async with app.router.lifespan_context(app):
            await send(300)  # warm-up: the pool, prepared statements, caches
            callgrind.start()
            await send(20)
            whole = callgrind.Calls()
            await send(requests, callgrind.counted_async(budget, whole))
            callgrind.dump_part("request", whole, coroutine=True)
            await callgrind.count_nothing(requests)
            for label, (target, name) in READ_PARTS.items():
                with callgrind.counting_part(target, name) as counted:
                    await send(requests)
                callgrind.dump_part(label, counted, asyncio.iscoroutinefunction(getattr(target, name)))

    asyncio.run(passes())


def read_instructions(requests: int) -> dict[str, float]:
    """Instructions per budget read in this process by part (each as counted in place, less what counting
    costs; PostgreSQL's own work is another process's), on a database of its own."""
    root = Path(__file__).resolve().parents[1]
    token = secrets.token_urlsafe(24)
    with migrated_database("gtk_bench_reads_cg") as url:
        seed(url_string(url).replace("postgresql+psycopg://", "postgresql://"), 100)
        arguments = ["--under-callgrind", url_string(url), token, "--requests", str(requests)]
        found = callgrind.run("bench.read_route", arguments, root)
    return {label: total / requests for label, total in callgrind.less_counting(found).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--namespaces", type=int, default=10_000)
    parser.add_argument("--profile", type=int, default=0, metavar="TOP", help="print cProfile's top frames")
    parser.add_argument(
        "--pods", type=int, default=4, help="pods per budget namespace in the ledger's last six hours"
    )
    parser.add_argument("--callgrind", action="store_true", help="instructions per budget read, by part")
    parser.add_argument("--under-callgrind", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.under_callgrind:
        _collect_reads(*args.under_callgrind, args.requests)
        return
    if args.callgrind:
        for label, count in read_instructions(args.requests).items():
            print(f"instructions per budget read, {label}: {count:,.0f}")
        return
    with migrated_database("gtk_bench_reads") as url:
        for cost in asyncio.run(costs(url, args.requests, args.namespaces, args.profile, args.pods)):
            print(cost.line())


if __name__ == "__main__":
    main()
