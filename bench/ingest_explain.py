"""PostgreSQL's side of one ingest batch, statement by statement: `EXPLAIN (ANALYZE, BUFFERS)` of the
statements a batch sends, captured from the real batch path and replayed in one transaction (rolled
back), on a private production-configured server whose tables hold a history bulk-loaded as ingest
writes it (bench/history.py's loader: N pods, D days, the raw window's last hour)."""

from __future__ import annotations

import argparse
import asyncio
import re
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from statistics import median
from typing import Any

import psycopg

import timekeeper.usage.repository as repository
from bench.common import dsn, new_database, postgres_server
from bench.history import MODEL, generate
from tests.support.partitions import partition_days_from
from tests.support.postgres import url_string
from tests.support.timekeeper import report_body
from timekeeper.clock import ManualClock
from timekeeper.db.session import build_engine, build_sessionmaker
from timekeeper.settings import Settings
from timekeeper.usage.charge_inputs import CHARGE_INPUTS
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import BatchEntry, IngestService

# What the loader's rows carry beside their times (as a sidecar's report of one H100 would).
FIGURES = {
    "mean_sm_util_pct": 50.0,
    "gpus": '[{"uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3", "sm_util_pct": 50.0}]',
    "peak_sm_util_pct": None,
    "mem_used_bytes": 1 << 30,
    "mean_power_w": None,
    "gpu_status_bits": 0,
    "gpu_model": MODEL,
}
NAMES = {
    repository._LOCK_PODS: "lock the pods, their uncovered time",
    repository._REPEATED: "the repeats",
    CHARGE_INPUTS: "the charge bases and weights",
    repository._ADD_MODELS: "the models' keys",
    repository._CHARGE: "charge: hourly aggregates, raw rows, coverage",
    repository._ADD_USED: "the running totals",
    repository._ADD_MODEL_USED: "the per-model totals",
    repository._ADD_BURN: "the burn buckets",
    repository._ADD_MODEL_BURN: "the per-model burn buckets",
    repository._MISMATCHED: "share mismatches",
}


def _name(query: str) -> str:
    if query in NAMES:
        return NAMES[query]
    if "namespace_status" in query and "FOR UPDATE" in query:
        return "lock the namespaces' states"
    if "usage_totals" in query and query.lstrip().upper().startswith(("WITH", "SELECT")):
        return "the namespaces' figures"
    return " ".join(query.split())[:60]


@contextmanager
def captured() -> Iterator[list[tuple[str, Any]]]:
    """The statements (and their parameters) psycopg's async cursors execute meanwhile."""
    statements: list[tuple[str, Any]] = []
    execute = psycopg.AsyncCursor.execute

    async def recording(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        statements.append((str(query), params))
        return await execute(self, query, params, **kwargs)

    psycopg.AsyncCursor.execute = recording  # type: ignore[method-assign]
    try:
        yield statements
    finally:
        psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]


def _reports(start: datetime, pods: int, namespaces: int, round_: int) -> list[ReportIn]:
    return [
        ReportIn.model_validate(
            report_body(
                namespace=f"ns-{i % namespaces}",
                pod=f"probe-{i}",
                pod_uid=f"probe-uid-{i}",
                seq=round_ + 1,
                start=start + timedelta(seconds=30 * round_),
                minutes=0.5,
                gpu_share=0.5,
                gpus=[{"uuid": "GPU-0", "sm_util_pct": 50.0, "name": MODEL}],
            )
        )
        for i in range(pods)
    ]


def explain(connection: psycopg.Connection[Any], statements: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Each statement run under EXPLAIN (ANALYZE, BUFFERS), in order, in one transaction rolled back."""
    found = []
    try:
        for query, params in statements:
            plan = "\n".join(
                row[0] for row in connection.execute(f"EXPLAIN (ANALYZE, BUFFERS) {query}", params)
            )
            buffers = re.search(r"Buffers: shared ([^\n]*)", plan)
            counts = dict(
                re.findall(r"(hit|read|dirtied|written)=(\d+)", buffers.group(1) if buffers else "")
            )
            found.append(
                {
                    "name": _name(query),
                    "planning_ms": float(re.search(r"Planning Time: ([\d.]+)", plan).group(1)),  # type: ignore[union-attr]
                    "execution_ms": float(re.search(r"Execution Time: ([\d.]+)", plan).group(1)),  # type: ignore[union-attr]
                    **{key: int(counts.get(key, 0)) for key in ("hit", "read", "dirtied", "written")},
                    "plan": plan,
                }
            )
    finally:
        connection.rollback()
    return found


async def batches(
    url: str, start: datetime, size: int, namespaces: int, rounds: int
) -> list[list[dict[str, Any]]]:
    """`rounds` batches of `size` reports (new pods' next 30 s, in the loaded namespaces), each charged
    once captured and rolled back, explained, then charged for real; the first rounds warm up."""
    engine = build_engine(url, pool_size=1)
    sessions = build_sessionmaker(engine)
    settings = Settings(database_url=url)
    clock = ManualClock(start)
    explained = []
    try:
        with psycopg.connect(
            url.replace("postgresql+psycopg://", "postgresql://"), options="-c timezone=UTC -c jit=off"
        ) as connection:
            for round_ in range(rounds):
                entries = [BatchEntry(report) for report in _reports(start, size, namespaces, round_)]
                clock.set(start + timedelta(seconds=30 * round_ + 35))
                if round_ >= 3:  # after the pods' first reports, once psycopg prepares the statements
                    with captured() as statements:
                        async with sessions() as session:
                            await IngestService(session, settings).charge(entries, clock.now())
                            await session.rollback()
                    explained.append(explain(connection, statements))
                    entries = [BatchEntry(entry.report) for entry in entries]
                async with sessions() as session:
                    await IngestService(session, settings).charge(entries, clock.now())
                    await session.commit()
    finally:
        await engine.dispose()
    return explained


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=2000, help="pods in the loaded history")
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--namespaces", type=int, default=100)
    parser.add_argument("--size", type=int, default=15, help="reports per explained batch")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--plans", action="store_true", help="print the last batch's plans")
    args = parser.parse_args()
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    until = now - timedelta(minutes=30)
    with postgres_server() as server:
        url = new_database(server, "gtk_explain")
        first_day = (until - timedelta(days=args.days)).replace(hour=0, minute=0)
        with psycopg.connect(
            dsn(url), autocommit=True
        ) as connection:  # day partitions, as the app makes them
            partition_days_from(connection, first_day, args.days + 2)
        generate(
            dsn(url), FIGURES, args.pods, args.namespaces, until - timedelta(days=args.days), until,
            6 * 3600, until - timedelta(hours=1),
        )  # fmt: skip
        with psycopg.connect(dsn(url), autocommit=True) as connection:
            connection.execute("VACUUM ANALYZE")
            sizes = connection.execute(
                "SELECT relname, n_live_tup FROM pg_stat_user_tables WHERE n_live_tup > 0 ORDER BY 2 DESC"
            ).fetchall()
        print("rows:", ", ".join(f"{name} {rows:,}" for name, rows in sizes))
        explained = asyncio.run(batches(url_string(url), until, args.size, args.namespaces, args.rounds))
    by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for batch in explained:
        for statement in batch:
            by_name[statement["name"]].append(statement)
    print(f"{len(explained)} batches of {args.size}, each statement's median per batch:")
    print(f"{'statement':48} {'plan ms':>8} {'exec ms':>8} {'hit':>6} {'read':>5} {'dirtied':>7}")
    for name, found in by_name.items():
        planning, execution = (median(s[key] for s in found) for key in ("planning_ms", "execution_ms"))
        hit, read, dirtied = (median(s[key] for s in found) for key in ("hit", "read", "dirtied"))
        print(f"{name:48} {planning:8.3f} {execution:8.3f} {hit:6.0f} {read:5.0f} {dirtied:7.0f}")
    total = sum(median(s["execution_ms"] for s in found) for found in by_name.values())
    per_report = 1000 * total / args.size
    print(
        f"statements per batch: {len(explained[-1])}; execution {total:.3f} ms, {per_report:.0f} µs a report"
    )
    if args.plans:
        for statement in explained[-1]:
            print(f"\n-- {statement['name']}\n{statement['plan']}")


if __name__ == "__main__":
    main()
