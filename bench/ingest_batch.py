"""CPU per report spent charging batches against a real PostgreSQL (the event loop thread's CPU time), without
and with billing weights in A B B A order, isolating the batch path from HTTP and wrk. Round trips per
batch: run it under `strace -f -c -e trace=sendto` (libpq sends once per round trip)."""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from statistics import mean

from sqlalchemy.ext.asyncio import AsyncEngine

from bench.ingest import WEIGHT_CHANGES, set_weights
from tests.support.postgres import url_string
from tests.support.timekeeper import migrated_database, report_body
from timekeeper.clock import ManualClock
from timekeeper.db.session import build_engine, build_sessionmaker
from timekeeper.metrics import Metrics
from timekeeper.settings import Settings
from timekeeper.usage.batcher import IngestBatcher
from timekeeper.usage.schemas import ReportIn

NAMESPACES = 100


@dataclass(frozen=True)
class BatchFigures:
    cpu_us_per_report: float
    wall_ms_per_batch: float


MODEL = "NVIDIA H100 80GB HBM3"  # the reports' GPU, one of set_weights' models


async def _batches(engine: AsyncEngine, batches: int, size: int, now: datetime) -> BatchFigures:
    clock = ManualClock(now)
    settings = Settings(database_url="postgresql+psycopg://unused@127.0.0.1/unused")
    sessions = build_sessionmaker(engine)
    batcher = IngestBatcher(lambda: sessions, settings, clock, Metrics(), max_batch=size, in_flight=1)
    start = now - timedelta(hours=2)

    def reports(round_: int) -> list[ReportIn]:
        return [
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

    prepared = [reports(r) for r in range(batches + batches // 10)]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--size", type=int, default=32)
    args = parser.parse_args()
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
