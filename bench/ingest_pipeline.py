"""Why ingest keeps psycopg's pipeline (timekeeper/db/pipeline.py): a batch's read sent in one pipeline and
sent statement by statement through SQLAlchemy, alternately, on a private production-configured
PostgreSQL; CPU and wall per batch. `python -m bench.ingest_pipeline [--batches 300] [--rounds 4]`"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from bench.common import new_database, postgres_server
from tests.support.postgres import url_string
from timekeeper.budgets.repository import figures_of, figures_parameters
from timekeeper.db.lists import arity
from timekeeper.db.pipeline import pipeline_sql
from timekeeper.db.session import build_engine, build_sessionmaker
from timekeeper.domain.periods import Interval
from timekeeper.usage import repository
from timekeeper.usage.charge_inputs import CHARGE_INPUTS, charge_inputs_parameters
from timekeeper.usage.repository import IngestStatements, batch_json

NOW = datetime.now(UTC) - timedelta(hours=1)
SPAN = (NOW - timedelta(seconds=30), NOW)
NAMESPACES = [f"ns-{index}" for index in range(10)]
PODS = batch_json(
    [
        {
            "pod_uid": f"uid-{index}",
            "namespace": NAMESPACES[index % len(NAMESPACES)],
            "pod": f"pod-{index}",
            "seq": 1,
            "interval_start": SPAN[0],
            "interval_end": SPAN[1],
            "final": False,
            "gpu_model": "NVIDIA-H100",
            "admitted_share": None,
        }
        for index in range(30)
    ]
)


@dataclass(slots=True)
class _Pod:
    """A report's record as IngestStatements.read fills it (the ingest's is usage/service.py BatchEntry)."""

    pod_uid: str
    uncovered: list[Interval] | None = None
    model: str | None = None
    admitted: Decimal | None = None
    repeated: bool = False
    mismatch_marked: bool = False


def _statements() -> list[tuple[str, dict[str, object]]]:
    """IngestStatements.read's statements, in its order."""
    return [
        (pipeline_sql(figures_of(arity(len(NAMESPACES)))), figures_parameters(NOW, NAMESPACES)),
        (repository._LOCK_PODS, {"pods": PODS, "now": NOW, "from_sidecar": True}),
        (CHARGE_INPUTS, charge_inputs_parameters(PODS, NAMESPACES, *SPAN)),
        (repository._REPEATED, {"pods": PODS}),
    ]


async def _compare(url: str, batches: int, rounds: int) -> None:
    engine = build_engine(url)
    sessions = build_sessionmaker(engine)

    async def pipelined() -> None:
        async with sessions() as session:
            records = [_Pod(f"uid-{index}") for index in range(30)]
            statements = await IngestStatements.of(session)
            await statements.read(records, PODS, NAMESPACES, SPAN, NOW, from_sidecar=True)
            await session.commit()

    async def one_by_one() -> None:
        async with sessions() as session:
            connection = await session.connection()
            for statement, parameters in _statements():
                (await connection.exec_driver_sql(statement, parameters)).all()
            await session.commit()

    variants: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("pipeline", pipelined),
        ("SQLAlchemy, one by one", one_by_one),
    ]
    for _ in range(20):  # the pool, prepared statements
        for _, variant in variants:
            await variant()
    for number in range(rounds):
        for name, variant in variants if number % 2 == 0 else variants[::-1]:
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(batches):
                await variant()
            print(
                f"{name}: {1e6 * (time.process_time() - cpu) / batches:,.0f} µs process CPU, "
                f"{1e6 * (time.perf_counter() - wall) / batches:,.0f} µs wall per batch read "
                f"(30 reports, {len(NAMESPACES)} namespaces); load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with postgres_server() as server:
        url = new_database(server, "ingest_pipeline")
        asyncio.run(_compare(url_string(url), args.batches, args.rounds))


if __name__ == "__main__":
    main()
