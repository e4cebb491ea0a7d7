"""CPU per report spent charging batches against a real PostgreSQL (the event loop thread's CPU time), without
and with billing weights in A B B A order, isolating the batch path from HTTP and wrk. Round trips per
batch: `--round-trips` (libpq's own trace of the protocol's messages). `--callgrind`: exact instructions per
report of this process (PostgreSQL's aside), in all and by part."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from statistics import mean
from typing import Any, cast

import psycopg
from psycopg import pq
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

import timekeeper.usage.repository
import timekeeper.usage.service
from bench import callgrind
from bench.ingest import WEIGHT_CHANGES, set_weights
from tests.support.postgres import url_string
from tests.support.timekeeper import migrated_database, report_body
from timekeeper.clock import ManualClock
from timekeeper.db.session import build_engine, build_sessionmaker
from timekeeper.metrics import Metrics
from timekeeper.settings import Settings
from timekeeper.usage.batcher import IngestBatcher
from timekeeper.usage.repository import IngestStatements
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import IngestService

NAMESPACES = 100


@dataclass(frozen=True)
class BatchFigures:
    cpu_us_per_report: float
    wall_ms_per_batch: float


MODEL = "NVIDIA H100 80GB HBM3"  # the reports' GPU, one of set_weights' models


def _reports(start: datetime, size: int, rounds: int) -> list[list[ReportIn]]:
    """`rounds` batches of `size` reports, one per pod, each round the pods' next 30 s from `start`."""
    return [
        [
            ReportIn.model_validate(
                report_body(
                    namespace=f"bench-{i % NAMESPACES}",
                    pod=f"pod-{i}",
                    pod_uid=f"uid-{i}",
                    seq=round_,
                    start=start + timedelta(seconds=30 * round_),
                    minutes=0.5,
                    gpu_share=0.5,
                    gpus=[{"uuid": "GPU-0", "sm_util_pct": 50.0, "name": MODEL}],
                )
            )
            for i in range(size)
        ]
        for round_ in range(rounds)
    ]


def _batcher(engine: AsyncEngine, size: int, clock: ManualClock) -> IngestBatcher:
    settings = Settings(database_url="postgresql+psycopg://unused@127.0.0.1/unused")
    sessions = build_sessionmaker(engine)
    return IngestBatcher(lambda: sessions, settings, clock, Metrics(), max_batch=size, in_flight=1)


async def _batches(engine: AsyncEngine, batches: int, size: int, now: datetime) -> BatchFigures:
    batcher = _batcher(engine, size, ManualClock(now))
    prepared = _reports(now - timedelta(hours=2), size, batches + batches // 10)
    batcher.start()
    try:
        for batch in prepared[: batches // 10]:  # warm-up: pods created, statements prepared
            await asyncio.gather(*(batcher.submit(r) for r in batch))
        cpu, wall = time.thread_time(), time.perf_counter()
        for batch in prepared[batches // 10 :]:
            await asyncio.gather(*(batcher.submit(r) for r in batch))
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    finally:
        await batcher.aclose()
    return BatchFigures(1e6 * cpu / (batches * size), 1e3 * wall / batches)


async def _run(url: str, batches: int, size: int, now: datetime) -> BatchFigures:
    engine = build_engine(url, pool_size=2)
    try:
        return await _batches(engine, batches, size, now)
    finally:
        await engine.dispose()


def measure(batches: int, size: int, *, weighted: bool) -> BatchFigures:
    """One run on a fresh database; with weights set as bench.ingest sets them."""
    now = datetime.now(UTC).replace(microsecond=0)
    with migrated_database("gtk_batch") as url:
        if weighted:
            set_weights(
                url_string(url.set(drivername="postgresql")),
                (now - timedelta(hours=2)).timestamp(),
                (*WEIGHT_CHANGES, *range(615, 30 * batches, 600)),
            )
        return asyncio.run(_run(url_string(url), batches, size, now))


@dataclass(frozen=True)
class RoundTrips:
    """What a batch sends PostgreSQL, from libpq's trace of every message: `round_trips`, the times the
    client stopped sending and read the server's answer (a run of frontend messages, then backend ones);
    `messages`, the frontend messages by type (Parse, Bind, Execute, Sync; Query: a simple-protocol
    statement such as psycopg's BEGIN and COMMIT)."""

    round_trips: float
    messages: dict[str, float]


def _round_trips(trace: str) -> tuple[int, Counter[str]]:
    """Round trips and frontend messages in a libpq trace (lines `F|B <length> <type> ...`)."""
    trips, sent, last = 0, Counter[str](), ""
    for line in trace.splitlines():
        direction, _, rest = line.partition("\t")
        if direction not in ("F", "B"):
            continue
        if direction == "F":
            sent[rest.split("\t")[1].split(" ")[0]] += 1
        elif last == "F":
            trips += 1
        last = direction
    return trips, sent


async def _traced_batches(url: str, batches: int, size: int, now: datetime) -> RoundTrips:
    """Charges `batches` batches of `size` after a warm-up, libpq tracing every message of the pool's
    connections meanwhile (one connection: one batch charged at a time)."""
    engine = build_engine(url, pool_size=1, max_overflow=0)
    batcher = _batcher(engine, size, ManualClock(now))
    prepared = _reports(now - timedelta(hours=2), size, batches + 10)
    connections: list[pq.abc.PGconn] = []
    batcher.start()
    with tempfile.TemporaryFile("w+") as trace:
        try:
            for batch in prepared[:10]:  # warm-up: pods created, statements prepared
                await asyncio.gather(*(batcher.submit(r) for r in batch))
            async with engine.connect() as connection:  # the pool's one connection, traced from now
                raw = await connection.get_raw_connection()
                pgconn = cast(psycopg.AsyncConnection[Any], raw.driver_connection).pgconn
                pgconn.trace(trace.fileno())
                pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
                connections.append(pgconn)
                await connection.rollback()
            for batch in prepared[10:]:
                await asyncio.gather(*(batcher.submit(r) for r in batch))
        finally:
            for pgconn in connections:
                pgconn.untrace()  # flushes the trace
            await batcher.aclose()
            await engine.dispose()
        trace.seek(0)
        text = trace.read()
    # The checkout above traced its own rollback: none was sent (nothing was begun).
    trips, sent = _round_trips(text)
    return RoundTrips(trips / batches, {kind: count / batches for kind, count in sorted(sent.items())})


def round_trips(batches: int, size: int) -> RoundTrips:
    now = datetime.now(UTC).replace(microsecond=0)
    with migrated_database("gtk_batch_rt") as url:
        return asyncio.run(_traced_batches(url_string(url), batches, size, now))


# The parts counted one pass each (toggles do not nest): where each is reached, and its attribute there.
PARTS: dict[str, tuple[Any, str]] = {
    "service_charge": (IngestService, "charge"),  # the batch's transaction less its session and commit
    "connection_checkout": (timekeeper.usage.repository, "pipeline_connection"),  # the pool's connection
    "statements_read": (IngestStatements, "read"),  # psycopg, the wire, the answers read into the records
    "namespace_figures": (timekeeper.usage.repository, "namespace_figures"),  # a namespace's, from its row
    "statements_write": (IngestStatements, "write"),
    "plan": (IngestService, "_plan"),  # the charge arithmetic, in Python
    "ledger_rows": (timekeeper.usage.service, "ledger_row"),  # the rows the write reads, as dicts
    "burn_buckets": (timekeeper.usage.service, "burn_json"),  # the forecast's five-minute buckets
    "model_burn_buckets": (timekeeper.usage.service, "model_burn_json"),
    "figures_after": (timekeeper.usage.service, "figures_after"),  # the namespaces' figures after the batch
    "batch_json": (timekeeper.usage.service, "batch_json"),  # the rows as the statements' JSON (orjson)
    "commit": (AsyncSession, "commit"),  # SQLAlchemy's commit, psycopg's COMMIT round trip
    "session_close": (AsyncSession, "close"),  # the connection back to the pool
}


def _collect(batches: int, size: int) -> None:
    """Run under callgrind: on a fresh database, each pass charges `batches` batches of `size` (the
    pods' next reports), counting one part."""
    rounds = 20 + (2 + len(PARTS)) * batches
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=30 * rounds)
    prepared = iter(enumerate(_reports(start, size, rounds)))
    clock = ManualClock(start)

    async def run(url: str) -> None:
        engine = build_engine(url, pool_size=2)
        batcher = _batcher(engine, size, clock)
        batcher.start()

        async def charge(count: int, each: Callable[[Awaitable[Any]], Awaitable[Any]] | None = None) -> None:
            for _ in range(count):
                round_, batch = next(prepared)
                clock.set(start + timedelta(seconds=30 * round_ + 35))  # each report just after its end
                gathered = asyncio.gather(*(batcher.submit(report) for report in batch))
                await (gathered if each is None else each(gathered))

        async def awaited(gathered: Awaitable[Any]) -> Any:
            return await gathered

        try:
            await charge(20)  # warm-up: pods created, statements prepared
            callgrind.start()
            whole = callgrind.Calls()
            await charge(batches, callgrind.counted_async(awaited, whole))
            callgrind.dump_part("batch", whole, coroutine=True)
            await callgrind.count_nothing(batches)
            for label, (target, name) in PARTS.items():
                with callgrind.counting_part(target, name) as calls:
                    await charge(batches)
                callgrind.dump_part(label, calls, asyncio.iscoroutinefunction(vars(target)[name]))
        finally:
            await batcher.aclose()
            await engine.dispose()

    with migrated_database("gtk_batch_cg") as url:
        asyncio.run(run(url_string(url)))


def instructions(batches: int, size: int) -> dict[str, float]:
    """Instructions per report of this process by part (each as counted in place, less what counting
    itself costs per call; `batch`: from the reports' submission to their answers)."""
    root = Path(__file__).resolve().parents[1]
    arguments = ["--under-callgrind", "--batches", str(batches), "--size", str(size)]
    found = callgrind.run("bench.ingest_batch", arguments, root)
    return {label: count / (batches * size) for label, count in callgrind.less_counting(found).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--callgrind", action="store_true", help="instructions per report, by part")
    parser.add_argument("--round-trips", action="store_true", help="round trips and messages per batch")
    parser.add_argument("--under-callgrind", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.round_trips:
        found = round_trips(args.batches, args.size)
        sent = ", ".join(f"{kind} {count:g}" for kind, count in found.messages.items())
        print(f"batches of {args.size}: {found.round_trips:g} round trips a batch; messages sent: {sent}")
        return
    if args.under_callgrind:
        _collect(args.batches, args.size)
        return
    if args.callgrind:
        for label, count in instructions(args.batches, args.size).items():
            print(f"instructions per report, batches of {args.size}, {label}: {count:,.0f}")
        return
    runs: dict[bool, list[BatchFigures]] = {False: [], True: []}
    for weighted in (False, True, True, False):
        figures = measure(args.batches, args.size, weighted=weighted)
        runs[weighted].append(figures)
        print(
            f"batches of {args.size}, {'with' if weighted else 'without'} weights: "
            f"{figures.cpu_us_per_report:.0f} µs CPU per report, "
            f"{figures.wall_ms_per_batch:.2f} ms per batch",
            flush=True,
        )
    plain, with_weights = (mean(f.cpu_us_per_report for f in runs[w]) for w in (False, True))
    print(
        f"mean µs CPU per report: without weights {plain:.0f}, with {with_weights:.0f} "
        f"({with_weights / plain:.2f}x)"
    )


if __name__ == "__main__":
    main()
