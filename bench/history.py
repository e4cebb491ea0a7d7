"""A month of history: a timekeeper on day 1, 7 and 30 of N GPU pods reporting every 30 s, bulk-loaded a
day and a slice of pods per statement in ingest's shapes (proved row by row against the ingest path on a
sample), the roll-up run as scheduled, on a private PostgreSQL configured like production.
`make bench-history ARGS=--quick`."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from statistics import median
from typing import Any

import httpx
import psycopg
from sqlalchemy.engine import URL

from bench.common import (
    PYTHON,
    REPO_ROOT,
    RESULTS_FILE,
    machine_description,
    new_database,
    percentile,
    postgres_server,
    postgres_settings_note,
    progress,
)
from bench.common import dsn as _dsn
from tests.support.partitions import partition_days_from
from tests.support.timekeeper import Tokens, alembic_config, bearer, report_body
from timekeeper.app import create_app, current
from timekeeper.clock import ManualClock
from timekeeper.periodic.jobs import JOBS_BY_NAME, run_job
from timekeeper.settings import Settings
from timekeeper.usage.repository import ADD_HOUR, HOUR_COLUMNS, INSERT_LEDGER

HOURLY_HISTORY: timedelta = Settings.model_fields["hourly_history"].default

STEP = 30  # seconds between a pod's reports
DAY = 86_400
MODEL = "NVIDIA H100 80GB HBM3"
# One section per pod count: a quick run and a larger one stand side by side.
SECTION = "## History: a month of reports at {pods:,} GPU pods (make bench-history)"
MEASURED_DAYS = (1, 7, 30)
ROUNDS = 3  # runs of each latency measurement on a measured day
# The day partitions the run lays out from the day before its first: the month, the loads after it and
# the days up to the real today (the bases lie 40 days back); the rest lands in the default partition.
SIMULATED_DAYS = 45


# --- the pods: slot i holds one pod at a time; each lives 1-8 lives' units, then the next one starts ---
def _life(slot: int, unit: int) -> int:
    return unit * (1 + slot % 8)


def _phase(slot: int, unit: int) -> int:
    return (slot * 7919 * STEP) % _life(slot, unit)


def _share(slot: int) -> float:
    return 1.0 if slot % 2 == 0 else 0.5


# The same pods in SQL, one statement per window (a UTC day, or the part of one the load covers) and
# slice of at most SLICE pods, so no statement grows with the pod count. Slot i's pods live `life`
# seconds each, one after another; in a window it holds one or more of them, each for a segment
# [seg_start, seg_end) of whole 30-s reports. A segment is what ingest leaves in that window: its pod's
# coverage extended by it (answering the pod's key), an aggregate for each hour it touches (a 30-s
# interval from a midnight lies in one hour, so none is continued), each with the sums ingest adds for
# that hour's n reports (usage/repository.py
# _CHARGE: figure x 30 s per report, n times), its namespace's monthly total and 5-minute burn buckets
# (each report's share x 30 s, counted per bucket). Ledger rows, one per report, only for reports ending
# after :raw_since (the raw window ingest keeps; NULL: every one): ticks from :ledger_from on.
_SLOTS = (
    "SELECT i AS slot, %(namespace_prefix)s || (i %% %(namespaces)s) AS namespace, "
    "CAST(%(unit)s AS bigint) * (1 + i %% 8) AS life, "
    "(i::bigint * 7919 * %(step)s) %% (%(unit)s * (1 + i %% 8)) AS phase, "
    "CASE WHEN i %% 2 = 0 THEN 1 ELSE 0.5 END::numeric AS share "
    "FROM generate_series(CAST(%(first)s AS bigint), CAST(%(last)s AS bigint) - 1, "
    "CAST(%(stride)s AS bigint)) AS i"
)
_GENERATED = (
    f"WITH slots AS MATERIALIZED ({_SLOTS}), "
    "segments AS MATERIALIZED (SELECT s.namespace, 'pod-' || s.slot || '-' || g AS pod, "
    "'uid-' || s.slot || '-' || g AS pod_uid, s.share, x.seg_start, x.seg_end, "
    "(x.seg_end - x.seg_start) / %(step)s AS n, "
    "(x.seg_end - %(step)s + s.phase - g * s.life) / %(step)s + 1 AS last_seq, "
    "x.seg_end + s.phase = (g + 1) * s.life AS final "
    "FROM slots s CROSS JOIN LATERAL generate_series((CAST(%(window_start)s AS bigint) + s.phase) / s.life, "
    "(CAST(%(window_end)s AS bigint) - %(step)s + s.phase) / s.life) AS g "
    "CROSS JOIN LATERAL (SELECT greatest(CAST(%(window_start)s AS bigint), g * s.life - s.phase) "
    "AS seg_start, "
    "least(CAST(%(window_end)s AS bigint), (g + 1) * s.life - s.phase) AS seg_end) AS x), "
    "ticks AS (SELECT s.namespace, s.share, t, (t + s.phase) / s.life AS generation, "
    "(t + s.phase) %% s.life AS age, s.slot, s.life FROM slots s "
    "CROSS JOIN generate_series(CAST(%(ledger_from)s AS bigint), "
    "CAST(%(window_end)s AS bigint) - %(step)s, %(step)s) AS t), "
    f"ledger AS ({INSERT_LEDGER} "
    "SELECT namespace, 'pod-' || slot || '-' || generation, 'uid-' || slot || '-' || generation, "
    "age / %(step)s + 1, to_timestamp(t), to_timestamp(t + %(step)s), share, "
    "tstzmultirange(tstzrange(to_timestamp(t), to_timestamp(t + %(step)s))), share * %(step)s / 60, "
    "age + %(step)s = life, to_timestamp(t + %(step)s) + interval '1 second', %(mean_sm_util_pct)s, "
    "CAST(%(gpus)s AS jsonb), %(peak_sm_util_pct)s, %(mem_used_bytes)s, %(mean_power_w)s, "
    "%(gpu_status_bits)s, share, %(gpu_model)s FROM ticks), "
    "coverage AS (INSERT INTO pod_coverage (pod_uid, namespace, pod, covered, last_seq, last_report_at, "
    "final, gpu_model) SELECT pod_uid, namespace, pod, "
    "tstzmultirange(tstzrange(to_timestamp(seg_start), to_timestamp(seg_end))), last_seq, "
    "to_timestamp(seg_end) + interval '1 second', final, %(gpu_model)s FROM segments ORDER BY pod_uid "
    "ON CONFLICT (pod_uid) DO UPDATE SET covered = pod_coverage.covered + excluded.covered, "
    "last_seq = excluded.last_seq, last_report_at = excluded.last_report_at, "
    "final = pod_coverage.final OR excluded.final RETURNING pod_uid, id), "
    f"hours AS (INSERT INTO usage_pod_hours AS h ({', '.join(HOUR_COLUMNS)}) "
    "SELECT c.id, to_timestamp(x.hour), s.share, s.share, "
    "(SELECT id FROM usage_models WHERE name = %(gpu_model)s), "
    "tstzmultirange(tstzrange(to_timestamp(x.hour_from), to_timestamp(x.hour_to))), x.n, 0, "
    "CAST(%(mean_sm_util_pct)s AS numeric(6, 3)) * %(step)s * x.n, "
    "CASE WHEN %(mean_sm_util_pct)s IS NULL THEN 0 ELSE x.n * %(step)s END, "
    "CAST(coalesce(%(peak_sm_util_pct)s, %(mean_sm_util_pct)s) AS numeric(6, 3)), "
    "CAST(%(mem_used_bytes)s AS bigint) * %(step)s * x.n, "
    "CASE WHEN %(mem_used_bytes)s IS NULL THEN 0 ELSE x.n * %(step)s END, "
    "CAST(%(mem_used_bytes)s AS bigint), CAST(%(mean_power_w)s AS numeric) * %(step)s * x.n, "
    "CAST(%(gpu_status_bits)s AS smallint) "
    "FROM segments s JOIN coverage c USING (pod_uid) "
    "CROSS JOIN LATERAL (SELECT hr AS hour, greatest(s.seg_start, hr) AS hour_from, "
    "least(s.seg_end, hr + 3600) AS hour_to, "
    "(least(s.seg_end, hr + 3600) - greatest(s.seg_start, hr)) / %(step)s AS n "
    "FROM generate_series(s.seg_start / 3600 * 3600, s.seg_end - 1, 3600) AS hr) AS x "
    "ORDER BY 1, 2, 3, 4 "
    f"{ADD_HOUR}), "
    "totals AS (INSERT INTO usage_totals (namespace, period_kind, period_start, used_gpu_minutes) "
    "SELECT namespace, 'monthly', date_trunc('month', to_timestamp(seg_start), 'UTC'), "
    "sum(share * n * %(step)s / 60) FROM segments GROUP BY 1, 3 ORDER BY 1, 3 "
    "ON CONFLICT (namespace, period_kind, period_start) "
    "DO UPDATE SET used_gpu_minutes = usage_totals.used_gpu_minutes + excluded.used_gpu_minutes) "
    "INSERT INTO usage_burn (namespace, bucket_start, gpu_minutes) "
    "SELECT s.namespace, to_timestamp(b), "
    "sum(s.share * (least(s.seg_end, b + 300) - greatest(s.seg_start, b)) / 60) FROM segments s "
    "CROSS JOIN LATERAL generate_series(s.seg_start / 300 * 300, s.seg_end - 1, 300) "
    "AS b GROUP BY 1, 2 ORDER BY 1, 2 ON CONFLICT (namespace, bucket_start) "
    "DO UPDATE SET gpu_minutes = usage_burn.gpu_minutes + excluded.gpu_minutes"
)
# The columns a report's row takes from its figures: copied from a row the real ingest wrote.
_FIGURE_COLUMNS = (
    "mean_sm_util_pct",
    "gpus",
    "peak_sm_util_pct",
    "mem_used_bytes",
    "mean_power_w",
    "gpu_status_bits",
    "gpu_model",
)
# What the proof compares, in a fixed order (ids and the ledger's insert order aside).
_COMPARED = {
    "usage_ledger": "SELECT namespace, pod, pod_uid, seq, interval_start, interval_end, gpu_share, "
    "charged::text, gpu_minutes, final, received_at, charge_share, "
    + ", ".join(f"{c}::text" for c in _FIGURE_COLUMNS)
    + " FROM usage_ledger WHERE CAST(%(raw_since)s AS timestamptz) IS NULL OR interval_end > %(raw_since)s "
    "ORDER BY pod_uid, seq",
    "pod_coverage": "SELECT pod_uid, namespace, pod, covered::text, last_seq, last_report_at, final, "
    "closed_at, "
    "gpu_model, admitted_share FROM pod_coverage ORDER BY pod_uid",
    "usage_totals": "SELECT namespace, period_kind, period_start, used_gpu_minutes, granted_gpu_minutes "
    "FROM usage_totals ORDER BY 1, 2, 3",
    "usage_burn": "SELECT namespace, bucket_start, gpu_minutes FROM usage_burn ORDER BY 1, 2",
    "usage_pod_hours": "SELECT c.pod_uid, h.hour_start, h.gpu_share, h.charge_share, m.name, "
    "h.charged::text, h.reports, h.reports_continued, h.util_seconds, h.util_covered_seconds, "
    "h.peak_sm_util_pct, h.mem_byte_seconds, h.mem_covered_seconds, h.peak_mem_used_bytes, "
    "h.energy_joules, h.gpu_status_bits FROM usage_pod_hours h JOIN pod_coverage c ON c.id = h.pod_key "
    "LEFT JOIN usage_models m ON m.id = h.model_key ORDER BY 1, 2, 3, 4, 5",
}
# What the proof compares once the roll-up has folded every hour into its day.
_COMPARED_DAYS = (
    "SELECT c.pod_uid, d.day_start, d.gpu_share, d.charge_share, m.name, "
    "d.charged::text, d.reports, d.reports_continued, d.util_seconds, d.util_covered_seconds, "
    "d.peak_sm_util_pct, d.mem_byte_seconds, d.mem_covered_seconds, d.peak_mem_used_bytes, "
    "d.energy_joules, d.gpu_status_bits FROM usage_pod_days d JOIN pod_coverage c ON c.id = d.pod_key "
    "LEFT JOIN usage_models m ON m.id = d.model_key ORDER BY 1, 2, 3, 4, 5"
)
# The sample's shapes the proof covers: lives crossing an hour; slot-hours where one pod replaced another.
_SHAPES = (
    "SELECT (SELECT count(*) FROM (SELECT pod_key FROM usage_pod_hours GROUP BY 1 HAVING count(*) > 1) "
    "AS x), "
    "(SELECT count(*) FROM (SELECT split_part(c.pod_uid, '-', 2), h.hour_start FROM usage_pod_hours h "
    "JOIN pod_coverage c ON c.id = h.pod_key GROUP BY 1, 2 HAVING count(*) > 1) AS y)"
)
# generate_series counts as 1,000 rows to the planner, so the loader's statements look costly enough to
# JIT-compile: 2.6 s of compiling for a 20-pod statement that runs in 10 ms.
_NO_JIT = "SET jit = off"
# The model's key, before the loader's statement looks it up (ingest gives a model its key first too).
_MODEL_KEY = (
    "INSERT INTO usage_models (name) SELECT CAST(%(gpu_model)s AS text) WHERE %(gpu_model)s IS NOT NULL "
    "ON CONFLICT DO NOTHING"
)


# Above this many pods the eight year-long exports alone would take hours (each reads a year of pod-hours).
EIGHT_EXPORTS_UP_TO = 10_000
SLICE = (
    2000  # pods per statement: each writes at most ~2 aggregates per pod, and 120 raw rows in the raw window
)


def windows(since: datetime, until: datetime) -> list[tuple[int, int]]:
    """[since, until) in epoch seconds, cut at each UTC midnight: the loader's windows, in time order."""
    start, end = int(since.timestamp()), int(until.timestamp())
    cuts = [start, *range((start // DAY + 1) * DAY, end, DAY), end]
    return list(itertools.pairwise(cuts)) if end > start else []


def generate(
    dsn: str,
    figures: dict[str, Any],
    pods: int,
    namespaces: int,
    since: datetime,
    until: datetime,
    unit: int,
    raw_since: datetime | None = None,
    namespace_prefix: str = "ns-",
    slice_pods: int = SLICE,
    workers: int = 1,
) -> None:
    """Load [since, until) as ingest would have written it, raw rows only for reports ending after
    raw_since (None: all): day by day (ingest's order), slice_pods pods per statement, a commit each. A
    day per statement writes each pod's 24 aggregates side by side in the index (an hour per statement
    revisited each pod's index page 24 times a day, and the pod's coverage row as often).
    With workers > 1, each loads the slots of one residue mod workers on a connection of its own: pods
    and (where workers divides namespaces) namespaces of its own, so they never wait on each other."""

    def load(worker: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as connection:
            connection.execute(_NO_JIT)
            connection.execute(_MODEL_KEY, figures)
            for start, end in windows(since, until):
                for first in range(worker, pods, slice_pods * workers):
                    connection.execute(
                        _GENERATED,
                        _generated(
                            figures,
                            (first, min(pods, first + slice_pods * workers), workers),
                            namespaces,
                            (start, end),
                            unit,
                            raw_since,
                            namespace_prefix,
                        ),
                    )

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(load, range(workers)))


def _generated(
    figures: dict[str, Any],
    slots: tuple[int, int, int],
    namespaces: int,
    window: tuple[int, int],
    unit: int,
    raw_since: datetime | None,
    namespace_prefix: str,
) -> dict[str, Any]:
    start, end = window
    # The first tick whose report ends after raw_since (a whole number of steps from the window's start).
    first_raw = start if raw_since is None else max(start, int(raw_since.timestamp()) - STEP + 1)
    return {
        **figures,
        "namespace_prefix": namespace_prefix,
        "first": slots[0],
        "last": slots[1],
        "stride": slots[2],
        "namespaces": namespaces,
        "unit": unit,
        "step": STEP,
        "window_start": start,
        "window_end": end,
        "ledger_from": start - (start - first_raw) // STEP * STEP,
    }


BASELINE_BATCH = 32  # reports per batch: the ingest batcher's largest
BASELINE_BATCHES = 100
_BASELINE_TABLES = ("usage_ledger", "pod_coverage", "usage_totals", "usage_burn")


def baseline_rows_per_second(dsn: str, figures: dict[str, Any], namespaces: int, start: datetime) -> float:
    """The limit beside ingest: the bulk loader's statement (the same tables, indexes and rows) in
    BASELINE_BATCHES batches of BASELINE_BATCH reports, one commit each; its rows deleted after."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(_NO_JIT)
        connection.execute(_MODEL_KEY, figures)
        began = time.perf_counter()
        for batch in range(BASELINE_BATCHES):
            tick = int((start + timedelta(seconds=STEP * batch)).timestamp())
            connection.execute(
                _GENERATED,
                _generated(
                    figures,
                    (0, BASELINE_BATCH, 1),
                    namespaces,
                    (tick, tick + STEP),
                    6 * 3600,
                    None,
                    "baseline-",
                ),
            )
        took = time.perf_counter() - began
        connection.execute(
            "DELETE FROM usage_pod_hours WHERE pod_key IN "
            "(SELECT id FROM pod_coverage WHERE namespace LIKE 'baseline-%%')"
        )
        for table in _BASELINE_TABLES:
            connection.execute(f"DELETE FROM {table} WHERE namespace LIKE 'baseline-%%'")
    return BASELINE_BATCH * BASELINE_BATCHES / took


def template_figures(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as connection:
        row = connection.execute(
            f"SELECT {', '.join(c + '::text' if c == 'gpus' else c for c in _FIGURE_COLUMNS)} "
            "FROM usage_ledger LIMIT 1"
        ).fetchone()
    assert row is not None, "the proof's ingest wrote rows"
    return dict(zip(_FIGURE_COLUMNS, row, strict=True))


# --- the app in-process ---
@dataclass
class Timekeeper:
    client: httpx.AsyncClient
    tokens: Tokens
    clock: ManualClock
    app: Any
    settings: Settings


@asynccontextmanager
async def timekeeper(url: URL, now: datetime) -> AsyncIterator[Timekeeper]:
    tokens, clock = Tokens(), ManualClock(now)
    settings = Settings(
        database_url=url.render_as_string(hide_password=False), scheduler_enabled=False, **tokens.settings()
    )
    app = create_app(settings, clock)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://timekeeper/api/v1") as client:
            yield Timekeeper(client, tokens, clock, app, settings)


async def set_budgets(tk: Timekeeper, namespaces: int) -> None:
    for index in range(namespaces):
        response = await tk.client.put(
            f"/namespaces/ns-{index}/budget",
            json={"budget_gpu_minutes": 10_000_000, "period": "monthly"},
            headers=bearer(tk.tokens.admin),
        )
        response.raise_for_status()


def _report(slot: int, namespaces: int, unit: int, tick: int, prefix: str = "") -> dict[str, Any]:
    life, phase = _life(slot, unit), _phase(slot, unit)
    generation, age = divmod(tick + phase, life)
    start = datetime.fromtimestamp(tick, UTC)
    return report_body(
        namespace=f"ns-{slot % namespaces}",
        pod=f"{prefix}pod-{slot}-{generation}",
        pod_uid=f"{prefix}uid-{slot}-{generation}",
        seq=age // STEP + 1,
        start=start,
        end=start + timedelta(seconds=STEP),
        gpu_share=_share(slot),
        final=age + STEP == life,
        gpus=[
            {
                "uuid": "GPU-0",
                "sm_util_pct": 50.0,
                "mem_used_bytes": 1 << 30,
                "mem_total_bytes": 1 << 34,
                "name": MODEL,
            }
        ],
    )


async def post_report(tk: Timekeeper, body: dict[str, Any]) -> None:
    response = await tk.client.post("/reports", json=body, headers=bearer(tk.tokens.reporter))
    if response.status_code != 200:
        raise RuntimeError(f"report refused: {response.status_code} {response.text}")


# --- the proof ---
async def _ingest_sample(
    url: URL, pods: int, namespaces: int, unit: int, since: datetime, until: datetime
) -> None:
    async with timekeeper(url, since) as tk:
        await set_budgets(tk, namespaces)
        for tick in range(int(since.timestamp()), int(until.timestamp()), STEP):
            tk.clock.set(datetime.fromtimestamp(tick + STEP + 1, UTC))
            await asyncio.gather(*(post_report(tk, _report(s, namespaces, unit, tick)) for s in range(pods)))


def prove(server: URL, since: datetime, name: str = "proof") -> tuple[dict[str, Any], str]:
    """The sample through the real ingest path and through the bulk loader, in databases named name_*;
    (template figures, verdict)."""
    pods, namespaces, unit, until = 6, 2, 20 * 60, since + timedelta(minutes=150)
    ingested = new_database(server, f"{name}_ingest")
    asyncio.run(_ingest_sample(ingested, pods, namespaces, unit, since, until))
    figures = template_figures(_dsn(ingested))
    # Loaded as the history loads it: day by day (split at the midnight), slices of 2 pods on 2 connections;
    # once keeping every raw row (as ingest did here) and once only the last hour's (the raw window).
    midnight = (since + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    differences = []
    counts: dict[str, int] = {}
    loaded: list[tuple[str, URL]] = []
    for kept, raw_since in (("bulk", None), ("window", until - timedelta(hours=1))):
        bulk = new_database(server, f"{name}_{kept}")

        async def budgets(url: URL = bulk) -> None:
            async with timekeeper(url, since) as tk:
                await set_budgets(tk, namespaces)

        asyncio.run(budgets())
        for start, end in ((since, midnight), (midnight, until)):
            generate(
                _dsn(bulk), figures, pods, namespaces, start, end, unit, raw_since, slice_pods=2, workers=2
            )
        with psycopg.connect(_dsn(ingested)) as a, psycopg.connect(_dsn(bulk)) as b:
            for table, query in _COMPARED.items():
                parameters = {"raw_since": raw_since}
                left, right = a.execute(query, parameters).fetchall(), b.execute(query, parameters).fetchall()
                counts[table if raw_since is None else f"{table} window"] = len(left)
                if left != right:
                    first = next((x, y) for x, y in itertools.zip_longest(left, right) if x != y)
                    differences.append(
                        f"{kept} {table}: {len(left)} vs {len(right)} rows, first difference {first}"
                    )
        loaded.append((kept, bulk))
    with psycopg.connect(_dsn(ingested)) as a:  # before the fold, which empties the pod-hours
        shapes = a.execute(_SHAPES).fetchone()
    assert shapes is not None
    # Then the roll-up as scheduled, days later: every hour folded into its day, on each side.
    for folded in (ingested, *(bulk for _, bulk in loaded)):
        asyncio.run(roll_up_at(folded, until + timedelta(days=3)))
    with psycopg.connect(_dsn(ingested)) as a:
        days = a.execute(_COMPARED_DAYS).fetchall()
        left_hours = a.execute("SELECT count(*) FROM usage_pod_hours").fetchone()
    counts["usage_pod_days"] = len(days)
    for kept, bulk in loaded:
        with psycopg.connect(_dsn(bulk)) as b:
            right = b.execute(_COMPARED_DAYS).fetchall()
        if right != days or not days or left_hours != (0,):
            first = (
                next((x, y) for x, y in itertools.zip_longest(days, right) if x != y)
                if right != days
                else None
            )
            differences.append(
                f"{kept} usage_pod_days: {len(days)} vs {len(right)} rows, first difference {first}"
            )
    if differences:
        raise SystemExit("the bulk loader differs from ingest:\n" + "\n".join(differences))
    finals = counts["pod_coverage"]
    return figures, (
        f"{pods} pods x 150 min across a midnight and two more hours (pods replaced every 20-160 min: "
        f"{finals} pod_uids, {shapes[0]} lives crossing an hour, {shapes[1]} pod-hours where a pod was "
        "replaced inside the hour) through POST /reports and "
        "through the bulk loader (day by day, 2 pods per statement on each of 2 connections): "
        "equal row by row in "
        f"usage_ledger ({counts['usage_ledger']} rows, every "
        f"column but id), pod_coverage ({finals}), usage_pod_hours ({counts['usage_pod_hours']}, by pod_uid "
        f"and model name), usage_totals ({counts['usage_totals']}), usage_burn ({counts['usage_burn']}); "
        f"loaded again keeping raw rows only for the last hour: the same, and usage_ledger equal to ingest's "
        f"{counts['usage_ledger window']} rows ending in that hour; then the roll-up days later on each: "
        f"every pod-hour folded, usage_pod_days equal ({counts['usage_pod_days']} rows)"
    )


async def roll_up_at(url: URL, now: datetime) -> dict[str, Any]:
    """The roll-up job run once at `now` (the raw rows past the raw window pruned, the pod-hours older than
    TIMEKEEPER_HOURLY_HISTORY folded into days); answers its detail."""
    async with timekeeper(url, now) as tk:
        sessions = current(tk.app).sessions
        result = await run_job(JOBS_BY_NAME["rollup"], sessions, tk.settings, tk.clock, "bench")
    assert result.detail is not None, f"the roll-up at {now} did not run: {result}"
    return result.detail


# --- measurements ---
@dataclass
class Day:
    day: int
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


async def ingest_load(
    tk: Timekeeper,
    start: datetime,
    seconds: float,
    namespaces: int,
    prefix: str,
    pods: int = 1000,
    concurrency: int = 32,
) -> tuple[float, float, int]:
    """(reports/s, p99 ms, reports) of `concurrency` clients for `seconds`: pods of their own reporting
    30 s intervals from `start` on, round after round."""
    bodies = (
        _report(slot, namespaces, 10**9, int(start.timestamp()) + STEP * round_, prefix)
        for round_ in itertools.count()
        for slot in range(pods)
    )
    tk.clock.set(start + timedelta(hours=2))
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < deadline:
            body = next(bodies)
            began = time.perf_counter()
            await post_report(tk, body)
            latencies.append(1000 * (time.perf_counter() - began))

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return len(latencies) / (time.perf_counter() - began), percentile(latencies, 0.99), len(latencies)


async def read_latencies(tk: Timekeeper, namespaces: int, reads: int = 300) -> tuple[float, float]:
    """(p50, p99) ms of budget reads one after another."""
    latencies = []
    for index in range(reads + 20):
        began = time.perf_counter()
        response = await tk.client.get(
            f"/namespaces/ns-{index % namespaces}/budget", headers=bearer(tk.tokens.reader)
        )
        response.raise_for_status()
        if index >= 20:
            latencies.append(1000 * (time.perf_counter() - began))
    return percentile(latencies, 0.5), percentile(latencies, 0.99)


async def snapshot_p99(tk: Timekeeper, dsn: str, samples: int = 30) -> float:
    latencies = []
    with psycopg.connect(dsn, autocommit=True) as connection:
        for index in range(samples + 3):
            connection.execute("UPDATE admission_version SET version = version + 1")
            began = time.perf_counter()
            response = await tk.client.get("/admission-state", headers=bearer(tk.tokens.reader))
            response.raise_for_status()
            if index >= 3:
                latencies.append(1000 * (time.perf_counter() - began))
    return percentile(latencies, 0.99)


async def usage_ms(tk: Timekeeper, since: datetime, until: datetime, group_by: str) -> float:
    times = []
    for _ in range(2):
        began = time.perf_counter()
        response = await tk.client.get(
            "/namespaces/ns-0/usage",
            params={"group_by": group_by, "since": since.isoformat(), "until": until.isoformat()},
            headers=bearer(tk.tokens.admin),
        )
        response.raise_for_status()
        times.append(1000 * (time.perf_counter() - began))
    return median(times)


def export_process(url: URL, since: datetime, until: datetime) -> subprocess.Popen[str]:
    """The chargeback export (daily periods, every namespace, CSV) in a process of its own (its peak RSS)."""
    return subprocess.Popen(
        [
            PYTHON,
            "-m",
            "bench.history",
            "--export",
            url.render_as_string(hide_password=False),
            since.isoformat(),
            until.isoformat(),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def export_figures(process: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = process.communicate()
    if process.returncode:
        raise RuntimeError(f"export failed ({process.returncode})")
    return dict(json.loads(out))


async def _export(url: str, since: datetime, until: datetime) -> dict[str, float]:
    from timekeeper.billing.chargeback import as_csv, chargeback_range, chargeback_rows
    from timekeeper.db.session import build_engine, build_sessionmaker

    engine = build_engine(url, pool_size=1)
    sessions = build_sessionmaker(engine)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    began = time.perf_counter()
    rows = size = 0
    span = chargeback_range("daily", since, until)
    async for chunk in as_csv(chargeback_rows(sessions, span, None, "USD")):
        rows += 1
        size += len(chunk)
    seconds = time.perf_counter() - began
    await engine.dispose()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "rows": rows - 1, "bytes": size, "rss_before_mib": before, "peak_mib": peak}


def sizes(dsn: str) -> dict[str, tuple[int, int, int, int, int, int]]:
    """Per table (the ledger's partitions summed): (table bytes, index bytes, live, dead tuples,
    autovacuums, autoanalyzes)."""
    with psycopg.connect(dsn) as connection:
        rows = connection.execute(
            "SELECT CASE WHEN relname LIKE 'usage_ledger%%' THEN 'usage_ledger' ELSE relname END, "
            "sum(pg_table_size(relid))::bigint, sum(pg_indexes_size(relid))::bigint, "
            "sum(n_live_tup)::bigint, sum(n_dead_tup)::bigint, "
            "sum(autovacuum_count)::bigint, sum(autoanalyze_count)::bigint "
            "FROM pg_stat_user_tables "
            "WHERE relname LIKE 'usage_ledger%%' "
            "OR relname IN ('usage_pod_hours', 'usage_pod_days', 'usage_models', 'pod_coverage', "
            "'usage_totals', 'usage_burn') "
            "GROUP BY 1"
        ).fetchall()
    return {name: tuple(values) for name, *values in rows}  # type: ignore[misc]


@dataclass(frozen=True)
class RolledUp:
    seconds: float
    rows: int  # raw ledger rows deleted
    partitions: int  # day partitions dropped
    folded: int = 0  # pod-hours folded into pod-days


async def roll_up_day(tk: Timekeeper, day_start: datetime, minutes: int) -> RolledUp:
    """The roll-up job run at each of its windows in the day, on a clock of its own (the ingest load may
    run beside it); its seconds, raw rows deleted, partitions dropped and pod-hours folded in all."""
    clock = ManualClock(day_start)
    took, rows, partitions, folded = 0.0, 0, 0, 0
    for step in range(1, 24 * 60 // minutes + 1):
        clock.set(day_start + timedelta(minutes=minutes * step))
        began = time.perf_counter()
        result = await run_job(JOBS_BY_NAME["rollup"], current(tk.app).sessions, tk.settings, clock, "bench")
        took += time.perf_counter() - began
        if result.detail is not None:
            rows += result.detail["deleted_rows"]
            partitions += len(result.detail["partitions_dropped"])
            folded += result.detail["pod_hours_folded"]
    return RolledUp(took, rows, partitions, folded)


async def watch_locks(dsn: str, seen: set[str], stop: asyncio.Event) -> None:
    """The locks the roll-up holds while its delete or drop statement runs, sampled."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
        while not stop.is_set():
            rows = await connection.execute(
                "SELECT coalesce(c.relname, l.locktype), l.mode FROM pg_locks l "
                "JOIN pg_stat_activity a ON a.pid = l.pid LEFT JOIN pg_class c ON c.oid = l.relation "
                "WHERE (a.query LIKE 'DELETE FROM ONLY %%usage_ledger%%' "
                "OR a.query LIKE 'DROP TABLE %%usage_ledger%%') "
                "AND a.state = 'active' "
                "AND l.granted AND c.relkind IN ('r', 'p')"
            )
            seen.update(f"{name} {mode}" for name, mode in await rows.fetchall())
            await asyncio.sleep(0.05)


def add_column_seconds(url: URL) -> float:
    """`alembic upgrade head` of a revision that adds a nullable column to usage_ledger."""
    config = alembic_config(url)
    scripts = Path(tempfile.mkdtemp(prefix="gtk-migrations-"))
    shutil.copytree(REPO_ROOT / "migrations", scripts / "migrations")
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None, "the migrations have a head"
    (scripts / "migrations" / "versions" / "bench_added_column.py").write_text(
        '"""bench: a column added on a month-old ledger."""\n'
        "import sqlalchemy as sa\nfrom alembic import op\n"
        f'revision = "bench0column"\ndown_revision = "{head}"\nbranch_labels = None\ndepends_on = None\n\n\n'
        "def upgrade() -> None:\n    op.add_column('usage_ledger', sa.Column('bench_note', sa.Text()))\n\n\n"
        "def downgrade() -> None:\n    op.drop_column('usage_ledger', 'bench_note')\n"
    )
    config.set_main_option("script_location", str(scripts / "migrations"))
    from alembic import command

    began = time.perf_counter()
    command.upgrade(config, "head")
    took = time.perf_counter() - began
    command.downgrade(config, head)
    shutil.rmtree(scripts, ignore_errors=True)
    return took


# --- the run ---
@dataclass
class Run:
    pods: int
    namespaces: int
    unit: int
    rollup_minutes: int
    load_seconds: float
    days: list[Day] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rollups: list[RolledUp] = field(default_factory=list)  # per day
    loads: list[float] = field(default_factory=list)  # the bulk loader's seconds per day
    eight_exports: bool = True  # ingest beside eight year-long exports, after day 30
    template: dict[str, Any] = field(default_factory=dict)  # the figure columns ingest wrote (the proof)
    workers: int = 2  # loader connections, each with pods and namespaces of its own


async def measure_day(run: Run, tk: Timekeeper, url: URL, base: datetime, day: int) -> Day:
    dsn = _dsn(url)
    end = base + timedelta(days=day)
    found = Day(day)
    # Each latency is the quietest of ROUNDS runs (the lowest p99, all of them in the notes): on a shared
    # 2-core machine one neighbour's burst would otherwise decide a day's figure.
    loads = [
        await ingest_load(
            tk, end + timedelta(minutes=round_), run.load_seconds, run.namespaces, f"load{day}-{round_}-"
        )
        for round_ in range(ROUNDS)
    ]
    rate, p99, _ = min(loads, key=lambda load: load[1])
    found.figures |= {"ingest reports/s": rate, "ingest p99 ms": p99}
    tk.clock.set(end + timedelta(hours=3))
    reads = [await read_latencies(tk, run.namespaces) for _ in range(ROUNDS)]
    found.figures["budget read p50 ms"], found.figures["budget read p99 ms"] = min(reads, key=lambda r: r[1])
    found.notes.append(
        f"p99 of each of {ROUNDS} runs (the table gives the lowest): ingest "
        + ", ".join(f"{load[1]:.1f}" for load in loads)
        + " ms; budget read "
        + ", ".join(f"{read[1]:.2f}" for read in reads)
        + " ms"
    )
    found.figures["snapshot build p99 ms"] = await snapshot_p99(tk, dsn)
    month = end - timedelta(days=30)
    for group in ("pod", "day"):
        found.figures[f"usage by {group}, a month, ms"] = await usage_ms(tk, month, end, group)
    export = export_figures(export_process(url, month, end))
    found.figures |= {
        "export of a month s": export["seconds"],
        "export peak RSS MiB": export["peak_mib"],
        "export rows": export["rows"],
    }
    found.notes.append(
        f"export: {export['rows']:.0f} rows, {export['bytes'] / 2**20:.1f} MiB of CSV, RSS "
        f"{export['rss_before_mib']:.0f} MiB before the first row"
    )
    for table, (table_bytes, index_bytes, live, dead, vacuums, analyzes) in sizes(dsn).items():
        found.figures[f"{table} table+index MiB"] = (table_bytes + index_bytes) / 2**20
        found.notes.append(
            f"{table}: table {table_bytes / 2**20:.1f} MiB, indexes {index_bytes / 2**20:.1f} "
            f"MiB, {live:,} live / {dead:,} dead tuples, autovacuum {vacuums}x, "
            f"autoanalyze {analyzes}x"
        )
    # After the sizes (its rows are deleted again); a year on, so no baseline pod is a history pod.
    baseline = baseline_rows_per_second(dsn, run.template, run.namespaces, end + timedelta(days=365))
    found.figures |= {"bulk baseline reports/s": baseline, "ingest / bulk baseline": rate / baseline}
    if day == 7:
        with psycopg.connect(dsn) as connection:
            row = connection.execute(
                "SELECT avg(pg_column_size(l.*)), avg(pg_column_size(l.gpus)), "
                "avg(pg_column_size(l.charged)) "
                "FROM usage_ledger l TABLESAMPLE SYSTEM (10)"
            ).fetchone()
        if row and row[0] is not None:
            found.notes.append(
                f"a ledger row holds {row[0]:.0f} bytes of data (its gpus JSON {row[1]:.0f}, its charged "
                f"multirange {row[2]:.0f}), before the tuple header, alignment and the indexes"
            )
    return found


async def history(run: Run, url: URL, figures: dict[str, Any], base: datetime) -> None:
    dsn = _dsn(url)
    run.template = figures
    with psycopg.connect(dsn, autocommit=True) as connection:  # the simulated month has its day partitions
        partition_days_from(connection, base - timedelta(days=1), SIMULATED_DAYS)
    async with timekeeper(url, base) as tk:
        await set_budgets(tk, run.namespaces)
        for day in range(1, 31):
            day_start = base + timedelta(days=day - 1)
            began = time.perf_counter()
            day_end = day_start + timedelta(days=1)
            # Raw rows only before a measured day: the next day's roll-up deletes them (and drops their
            # day's partition), so the days between end as they would with them, at a quarter of the load.
            retention = tk.settings.ledger_retention if day in MEASURED_DAYS else timedelta(0)
            raw_since = day_end - retention
            generate(
                dsn,
                figures,
                run.pods,
                run.namespaces,
                day_start,
                day_end,
                run.unit,
                raw_since,
                workers=run.workers,
            )
            generated = time.perf_counter() - began
            run.loads.append(generated)
            if day == 30:
                await measure_rollup_under_load(run, tk, url, day_start)
            else:
                run.rollups.append(await roll_up_day(tk, day_start, run.rollup_minutes))
            tk.clock.set(day_start + timedelta(days=1))
            await run_job(JOBS_BY_NAME["closeout"], current(tk.app).sessions, tk.settings, tk.clock, "bench")
            progress(
                f"history day {day}: {run.pods * 2880:,} reports loaded in {generated:.1f}s, "
                f"roll-up {run.rollups[-1].seconds:.1f}s"
            )
            if day in MEASURED_DAYS:
                run.days.append(await measure_day(run, tk, url, base, day))
                progress(f"day {day} measured: {run.days[-1].figures}")
        if run.eight_exports:
            await eight_exports(run, tk, url, base + timedelta(days=30))
    run.notes.append(
        f"`alembic upgrade head` adding a nullable column to usage_ledger on day 30: "
        f"{add_column_seconds(url):.2f} s (and its downgrade after)"
    )


async def measure_rollup_under_load(run: Run, tk: Timekeeper, url: URL, day_start: datetime) -> None:
    """Day 30's roll-up (the last day's windows back to back) while the ingest load runs."""
    dsn = _dsn(url)
    seen: set[str] = set()
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch_locks(dsn, seen, stop))
    rolled = asyncio.create_task(roll_up_day(tk, day_start, run.rollup_minutes))
    rate, p99, count = await ingest_load(
        tk, day_start + timedelta(days=3), run.load_seconds, run.namespaces, "rollup-"
    )
    run.rollups.append(await rolled)
    stop.set()
    await watcher
    run.notes.append(
        f"ingest during day 30's roll-up windows run back to back: {rate:,.0f} reports/s, p99 {p99:.1f} ms "
        f"({count:,} reports); locks the roll-up statement held: {', '.join(sorted(seen)) or 'none sampled'}"
    )


async def export_over_http(tk: Timekeeper, since: datetime, until: datetime) -> float:
    """GET /billing/chargeback (daily, CSV) through the app, where exports take turns: one refused 429
    asks again after its Retry-After, as a script would; its seconds, the waits included."""
    began = time.perf_counter()
    while True:
        response = await tk.client.get(
            "/billing/chargeback",
            params={
                "since": since.isoformat(),
                "until": until.isoformat(),
                "period": "daily",
                "format": "csv",
            },
            headers=bearer(tk.tokens.admin),
            timeout=None,
        )
        if response.status_code != 429:
            break
        await asyncio.sleep(float(response.headers["retry-after"]))
    response.raise_for_status()
    return time.perf_counter() - began


async def eight_exports(run: Run, tk: Timekeeper, url: URL, end: datetime) -> None:
    """Ingest p99 without exports, beside eight year-long daily exports through the app (they take
    turns), and beside eight run at once in processes of their own (no turns)."""
    plain_rate, plain_p99, _ = await ingest_load(
        tk, end + timedelta(days=4), run.load_seconds, run.namespaces, "plain-"
    )
    year = end - timedelta(days=399)
    in_turn = [asyncio.create_task(export_over_http(tk, year, end)) for _ in range(8)]
    rate, p99, _ = await ingest_load(tk, end + timedelta(days=5), run.load_seconds, run.namespaces, "turns-")
    waited = [await task for task in in_turn]
    at_once = [export_process(url, year, end) for _ in range(8)]
    free_rate, free_p99, _ = await ingest_load(
        tk, end + timedelta(days=6), run.load_seconds, run.namespaces, "at-once-"
    )
    results = [export_figures(process) for process in at_once]
    run.notes.append(
        "ingest beside eight year-long daily exports (GET /billing/chargeback, taking turns, a 429 asked "
        "again after its Retry-After): "
        f"p99 {p99:.1f} ms vs {plain_p99:.1f} ms without ({p99 / plain_p99:.2f}x), "
        f"{rate:,.0f} vs {plain_rate:,.0f} reports/s; "
        f"the eighth answered after {max(waited):.1f} s. Eight at once in processes of their own (no turns): "
        f"p99 {free_p99:.1f} ms ({free_p99 / plain_p99:.2f}x), {free_rate:,.0f} reports/s; they took "
        f"{min(r['seconds'] for r in results):.1f}-{max(r['seconds'] for r in results):.1f} s, peak RSS "
        f"{max(r['peak_mib'] for r in results):.0f} MiB"
    )


def per_pod_day(run: Run) -> tuple[float, float, float, float]:
    """(raw ledger bytes per pod held, pod-hour bytes per pod-day they cover, pod-day bytes per pod-day
    they cover, everything per pod-day), on day 30: the pod-hours cover the hourly window's days
    (TIMEKEEPER_HOURLY_HISTORY), the pod-days the rest of the month."""
    day30 = next(d for d in run.days if d.day == 30).figures
    raw = day30.get("usage_ledger table+index MiB", 0.0) * 2**20 / run.pods
    hourly_days = min(29.0, HOURLY_HISTORY.total_seconds() / 86_400)
    hourly = day30["usage_pod_hours table+index MiB"] * 2**20 / (run.pods * hourly_days)
    daily = day30.get("usage_pod_days table+index MiB", 0.0) * 2**20 / (run.pods * (30 - hourly_days))
    total = sum(v for k, v in day30.items() if k.endswith("table+index MiB")) * 2**20 / (run.pods * 30)
    return raw, hourly, daily, total


def conditions(load: tuple[str, str]) -> str:
    """The load average around the run; a machine already busy before it is said to be shared."""
    cores = os.cpu_count() or 1
    busy = float(load[0].split("/")[0]) > cores / 2
    said = "**The machine was shared with other work**" if busy else "A quiet machine"
    return (
        f"{said}: load average (1/5/15 min) {load[0]} before, {load[1]} after (the run's own), "
        f"on {cores} cores" + (": figures are lower and noisier than a quiet machine gives." if busy else ".")
    )


def write(run: Run, proof: str, load: tuple[str, str], seconds: float) -> str:
    days = {d.day: d for d in run.days}
    names = list(run.days[0].figures)
    section = SECTION.format(pods=run.pods)
    lines = [
        section,
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M UTC} by "
        f"`make bench-history ARGS='{' '.join(sys.argv[1:])}'`"
        f" in {seconds / 60:.1f} min on {machine_description()}. {run.pods:,} GPU pods in {run.namespaces} "
        f"namespaces, a report each every {STEP} s ({run.pods * 2880:,} a day), pods replaced every "
        f"{run.unit // 3600}-{8 * run.unit // 3600} h; the roll-up every {run.rollup_minutes} min of "
        "simulated "
        "time, raw rows kept for TIMEKEEPER_LEDGER_RETENTION's default (an hour); the history is hourly "
        "aggregates written with each charge, folded by the roll-up into pod-days past "
        f"TIMEKEEPER_HOURLY_HISTORY's default ({HOURLY_HISTORY.days} days).",
        conditions(load),
        "",
        "| figure | day 1 | day 7 | day 30 |",
        "|---|---|---|---|",
    ]
    for name in names:
        lines.append(
            f"| {name} | "
            + " | ".join(f"{days[d].figures.get(name, float('nan')):,.2f}" for d in MEASURED_DAYS)
            + " |"
        )
    raw, hourly, daily, total = per_pod_day(run)
    day_one = datetime(2000, 1, 1, tzinfo=UTC)
    folding = [rolled for rolled in run.rollups if rolled.rows]
    per_day = median(rolled.seconds for rolled in folding) if folding else 0.0
    lines += [
        "",
        f"- bytes: raw ledger held on day 30 {raw:,.0f} per pod (table + indexes, the raw window), pod-hours "
        f"{hourly:,.0f} per pod-day they hold (the last {HOURLY_HISTORY.days} days), pod-days "
        f"{daily:,.0f} per pod-day they hold (the rest), everything on day 30 / pod-days held {total:,.0f}",
        f"- roll-up of one day of data (its {24 * 60 // run.rollup_minutes} windows): "
        f"median {per_day:.1f} s, "
        f"max {max((rolled.seconds for rolled in folding), default=0):.1f} s, "
        f"{folding[0].rows if folding else 0:,} raw rows deleted and "
        f"{folding[0].partitions if folding else 0} day partition(s) dropped per day (the raw ledger is "
        "partitioned by day: rows past the raw window are deleted an hour at a time, a past day dropped), "
        f"{folding[-1].folded if folding else 0:,} pod-hours folded into pod-days per day (one statement "
        "an hour)",
        f"- history loaded by the bulk loader, a day in {len(windows(day_one, day_one + timedelta(days=1)))}"
        f" statement x {-(-run.pods // (SLICE * run.workers))} slice(s) of at most {SLICE:,} pods on each of "
        f"{run.workers} connection(s) (pods and namespaces of its own), a statement and commit each; raw "
        f"rows only on the days before a measurement (days {', '.join(map(str, MEASURED_DAYS))}: on the "
        "others the next roll-up would delete them and drop their partition): "
        f"median {median(run.loads):.1f} s per simulated day, max {max(run.loads):.1f} s, "
        f"{sum(run.loads) / 60:.1f} min for the month; proof: {proof}",
        "- ingest is driven in-process (httpx over ASGI: the 32 clients share the timekeeper's process and "
        "event loop), so its rates compare days with each other, not with `make bench`'s; the bulk baseline "
        f"is the bulk loader's statement in {BASELINE_BATCHES} batches of {BASELINE_BATCH} reports, one "
        "commit each, one connection (its rows deleted after)",
        *[f"- day {d.day}: {note}" for d in run.days for note in d.notes],
        *[f"- {note}" for note in run.notes],
        f"- {postgres_settings_note()}",
        "",
    ]
    text = RESULTS_FILE.read_text()
    if section in text:
        before, _, after = text.partition(section)
        rest = after.split("\n## ", 1)
        text = before + "\n".join(lines) + ("\n## " + rest[1] if len(rest) > 1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(lines)
    RESULTS_FILE.write_text(text)
    read = days[30].figures["budget read p99 ms"] / days[1].figures["budget read p99 ms"]
    ingest = days[30].figures["ingest p99 ms"] / days[1].figures["ingest p99 ms"]
    return (
        f"history: read p99 day-30/day-1 {read:.2f}x, ingest p99 day-30/day-1 {ingest:.2f}x, "
        f"{total:,.0f} bytes per pod-day, roll-up of a day {per_day:.1f} s, export of a month "
        f"{days[30].figures['export of a month s']:.1f} s "
        f"peak {days[30].figures['export peak RSS MiB']:.0f} MiB"
    )


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=10_000, help="GPU pods at any time (default 10,000)")
    parser.add_argument("--namespaces", type=int, default=0, help="default: one per 50 pods, at least 4")
    parser.add_argument(
        "--quick", action="store_true", help="20 pods in 5 namespaces, the roll-up hourly, 5 s of load"
    )
    parser.add_argument("--load-seconds", type=float, default=10.0)
    parser.add_argument("--rollup-minutes", type=int, default=10, help="the roll-up job's interval")
    parser.add_argument("--proof-only", action="store_true", help="only the bulk loader's proof")
    parser.add_argument(
        "--eight-exports",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ingest beside eight year-long exports (8 x the export of a month x 12, in turn); "
        f"default: up to {EIGHT_EXPORTS_UP_TO:,} pods",
    )
    parser.add_argument("--workers", type=int, default=2, help="the bulk loader's connections (default 2)")
    parser.add_argument("--export", nargs=3, metavar=("URL", "SINCE", "UNTIL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export:
        url, since, until = args.export
        print(
            json.dumps(
                asyncio.run(_export(url, datetime.fromisoformat(since), datetime.fromisoformat(until)))
            )
        )
        return
    pods = 20 if args.quick else args.pods
    run = Run(
        pods,
        args.namespaces or (5 if args.quick else max(4, pods // 50)),
        6 * 3600,
        60 if args.quick else args.rollup_minutes,
        5.0 if args.quick else args.load_seconds,
    )
    run.eight_exports = pods <= EIGHT_EXPORTS_UP_TO if args.eight_exports is None else args.eight_exports
    run.workers = args.workers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the private server stops on a kill too
    started, load_before = time.perf_counter(), _load()
    base = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=40)
    with postgres_server() as server:
        progress("proof: a sample through ingest and through the bulk loader")
        figures, proof = prove(server, base - timedelta(days=2, minutes=45))  # across a midnight
        progress(proof)
        if args.proof_only:
            return
        asyncio.run(history(run, new_database(server, "history"), figures, base))
    print(write(run, proof, (load_before, _load()), time.perf_counter() - started))


if __name__ == "__main__":
    main()
