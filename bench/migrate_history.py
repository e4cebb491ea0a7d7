"""The upgrade to history as hourly aggregates (migration 9a4c6e2f1b37) on a month of N GPU pods held in the
schema before it, timed, with every charged second compared before and after; then the roll-up's first run
after the upgrade, which folds the month's old hours into pod-days (migration 7d3a5c1e9f62), timed and
compared again. `make bench-migrate-history`.

The month is written in the old schema's shapes by one statement per UTC hour, as the old bench loader
wrote them (the pods of bench/history.py): the last days as raw ledger rows, the older ones as the rows the
old roll-up would have left of them in usage_hourly, written directly (one per pod and hour segment, the
roll-up's sums of its reports), with the pods' coverage, monthly totals and burn buckets as ingest kept
them. The raw days lie in day partitions as the old roll-up left the ledger: it folded a day partition once
the whole day was older than the retention, so the report ending on the cutoff is still raw."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL

from bench.common import (
    RESULTS_FILE,
    dsn,
    machine_description,
    postgres_server,
    postgres_settings_note,
    progress,
)
from bench.history import conditions, roll_up_at
from tests.support.partitions import partition_days_from
from tests.support.timekeeper import alembic_config

MIGRATION = "9a4c6e2f1b37"
STEP = 30  # seconds between a pod's reports
UNIT = 6 * 3600  # pods live 1-8 units, as in bench/history.py
SECTION = "## The upgrade to hourly aggregates and pod-days at {pods:,} GPU pods (make bench-migrate-history)"
# What a report's row holds beside its charge: what ingest stored for bench/history.py's report (one GPU at
# 50 % SM, 1 GiB used, no power figure), in the old schema's columns.
FIGURES: dict[str, Any] = {
    "mean_sm_util_pct": Decimal("50.000"),
    "peak_sm_util_pct": Decimal("50.000"),
    "mem_used_bytes": 1 << 30,
    "mean_power_w": None,
    "gpu_status_bits": 0,
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "gpus": '[["GPU-0", 50.0, 1073741824, 17179869184, null, null, null, "NVIDIA H100 80GB HBM3"]]',
}

# Slot i holds one pod at a time, each living `life` seconds, then the next one starts (bench/history.py's
# pods). In a window (a UTC hour) a slot holds one or more of them, each for a segment [seg_start, seg_end)
# of whole reports. Reports from :raw_from on are raw ledger rows; the segment's part before it is the old
# roll-up's hourly row (its n reports' sums: figure x 30 s each). Coverage, totals and burn count the whole
# segment, as ingest did.
_SLOTS = (
    "SELECT i AS slot, 'ns-' || (i %% %(namespaces)s) AS namespace, "
    "CAST(%(unit)s AS bigint) * (1 + i %% 8) AS life, "
    "(i::bigint * 7919 * %(step)s) %% (%(unit)s * (1 + i %% 8)) AS phase, "
    "CASE WHEN i %% 2 = 0 THEN 1 ELSE 0.5 END::numeric AS share "
    "FROM generate_series(0, CAST(%(pods)s AS bigint) - 1) AS i"
)
_OLD_HOUR = (
    f"WITH slots AS MATERIALIZED ({_SLOTS}), "
    "segments AS MATERIALIZED (SELECT s.namespace, 'pod-' || s.slot || '-' || g AS pod, "
    "'uid-' || s.slot || '-' || g AS pod_uid, s.share, x.seg_start, x.seg_end, "
    "least(x.seg_end, CAST(%(raw_from)s AS bigint)) AS rolled_end, "
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
    "CROSS JOIN generate_series(greatest(CAST(%(window_start)s AS bigint), CAST(%(raw_from)s AS bigint)), "
    "CAST(%(window_end)s AS bigint) - %(step)s, %(step)s) AS t), "
    "ledger AS (INSERT INTO usage_ledger (namespace, pod, pod_uid, seq, interval_start, interval_end, "
    "gpu_share, charged, gpu_minutes, final, received_at, mean_sm_util_pct, gpus, peak_sm_util_pct, "
    "mem_used_bytes, mean_power_w, gpu_status_bits, charge_share, gpu_model) "
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
    "final = pod_coverage.final OR excluded.final), "
    "hourly AS (INSERT INTO usage_hourly (namespace, pod, pod_uid, hour_start, gpu_share, charge_share, "
    "gpu_model, charged, reports, util_seconds, util_covered_seconds, peak_sm_util_pct, mem_byte_seconds, "
    "mem_covered_seconds, peak_mem_used_bytes, energy_joules, gpu_status_bits) "
    "SELECT namespace, pod, pod_uid, date_trunc('hour', to_timestamp(seg_start), 'UTC'), share, share, "
    "%(gpu_model)s, tstzmultirange(tstzrange(to_timestamp(seg_start), to_timestamp(rolled_end))), "
    "(rolled_end - seg_start) / %(step)s, "
    "CAST(%(mean_sm_util_pct)s AS numeric(6, 3)) * (rolled_end - seg_start), "
    "CASE WHEN %(mean_sm_util_pct)s IS NULL THEN 0 ELSE rolled_end - seg_start END, "
    "CAST(coalesce(%(peak_sm_util_pct)s, %(mean_sm_util_pct)s) AS numeric(6, 3)), "
    "CAST(%(mem_used_bytes)s AS bigint) * (rolled_end - seg_start), "
    "CASE WHEN %(mem_used_bytes)s IS NULL THEN 0 ELSE rolled_end - seg_start END, "
    "CAST(%(mem_used_bytes)s AS bigint), CAST(%(mean_power_w)s AS numeric) * (rolled_end - seg_start), "
    "CAST(%(gpu_status_bits)s AS smallint) FROM segments WHERE seg_start < rolled_end), "
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

# The charge per namespace and UTC day: seconds charged, GPU-seconds (x the charge share) and reports (a
# report once in each hour its charge touches, as the fold counts it). Before: the old hourly rows and the
# raw ledger rows split at the hours; after: the pod-hour aggregates, under their pod's namespace.
_SECONDS = "(SELECT sum(extract(epoch FROM upper(r) - lower(r))) FROM unnest(charged) AS r)"
_RAW_HOURS = (
    "SELECT l.namespace, l.pod_uid, b AS hour_start, l.charge_share, "
    "range_agg(r * tstzrange(b, b + interval '1 hour')) AS charged, 1 AS reports "
    "FROM usage_ledger l CROSS JOIN LATERAL unnest(l.charged) AS r "
    "CROSS JOIN LATERAL generate_series(date_trunc('hour', lower(r), 'UTC'), "
    "upper(r) - interval '1 microsecond', interval '1 hour') AS b "
    "GROUP BY l.id, l.interval_end, l.namespace, l.pod_uid, b, l.charge_share"
)
_BEFORE = (
    "SELECT namespace, pod_uid, hour_start, charge_share, charged, reports FROM usage_hourly "
    f"UNION ALL {_RAW_HOURS}"
)
_AFTER = (
    "SELECT c.namespace, c.pod_uid, h.hour_start, h.charge_share, h.charged, h.reports "
    "FROM usage_pod_hours h JOIN pod_coverage c ON c.id = h.pod_key"
)
# After the first roll-up: the pod-hours and pod-days as every reader reads them (usage_history), a day's
# row under its day's start.
_FOLDED = (
    "SELECT c.namespace, c.pod_uid, h.bucket_start AS hour_start, h.charge_share, h.charged, h.reports "
    "FROM usage_history('-infinity', NULL) h JOIN pod_coverage c ON c.id = h.pod_key"
)
_PER_DAY = (
    "SELECT namespace, date_trunc('day', hour_start, 'UTC') AS day, sum(s.seconds), "
    "sum(charge_share * s.seconds), sum(reports) "
    "FROM ({rows}) AS x CROSS JOIN LATERAL (SELECT "
    + _SECONDS
    + " AS seconds) AS s GROUP BY 1, 2 ORDER BY 1, 2"
)
# Each pod's charged time, as one multirange: the seconds charged, and when.
_PER_POD = (
    "SELECT pod_uid, range_agg(r)::text FROM ({rows}) AS x CROSS JOIN LATERAL unnest(x.charged) AS r "
    "GROUP BY 1 ORDER BY 1"
)
# GPU-minutes charged per namespace and month beside usage_totals' (the budgets' figure): equal when the
# history holds every charged minute.
_PER_MONTH = (
    "SELECT x.namespace, x.month, x.minutes, t.used_gpu_minutes FROM (SELECT namespace, "
    "date_trunc('month', hour_start, 'UTC') AS month, sum(charge_share * s.seconds) / 60 AS minutes "
    "FROM ({rows}) AS y CROSS JOIN LATERAL (SELECT " + _SECONDS + " AS seconds) AS s GROUP BY 1, 2) AS x "
    "FULL JOIN usage_totals t ON t.namespace = x.namespace AND t.period_start = x.month "
    "AND t.period_kind = 'monthly' WHERE x.minutes IS DISTINCT FROM t.used_gpu_minutes"
)
# What the migration must leave as it was.
_UNTOUCHED = {
    "usage_totals": "SELECT namespace, period_kind, period_start, used_gpu_minutes, granted_gpu_minutes "
    "FROM usage_totals ORDER BY 1, 2, 3",
    "usage_burn": "SELECT namespace, bucket_start, gpu_minutes FROM usage_burn ORDER BY 1, 2",
    "pod_coverage": "SELECT pod_uid, namespace, pod, covered::text, last_seq, last_report_at, final, "
    "gpu_model FROM pod_coverage ORDER BY pod_uid",
}


def hours(since: datetime, until: datetime) -> list[tuple[int, int]]:
    """[since, until) in epoch seconds, cut at each UTC hour: the old schema kept one hourly row per pod
    and hour, so the old loader wrote an hour per statement."""
    start, end = int(since.timestamp()), int(until.timestamp())
    cuts = [start, *range((start // 3600 + 1) * 3600, end, 3600), end]
    return list(itertools.pairwise(cuts)) if end > start else []


@dataclass(frozen=True)
class Month:
    """The history: `days` days of `pods` GPU pods ending at `end` (a UTC midnight), the last `raw_days`
    of them raw."""

    pods: int
    namespaces: int
    end: datetime
    days: int = 30
    raw_days: int = 7

    @property
    def raw_from(self) -> int:
        """The first raw report's start: the one ending on the old roll-up's cutoff is still raw."""
        return int((self.end - timedelta(days=self.raw_days)).timestamp()) - STEP


@dataclass
class Charged:
    """The charge as one schema holds it."""

    per_day: list[tuple[Any, ...]]
    per_pod: list[tuple[Any, ...]]
    untouched: dict[str, list[tuple[Any, ...]]]
    totals_differ: list[tuple[Any, ...]]  # namespace-months whose charged minutes differ from usage_totals


@dataclass
class Migrated:
    raw_rows: int
    hourly_rows: int
    aggregate_rows: int
    load_seconds: float
    migration_seconds: float
    head_seconds: float  # the later revisions, up to head
    load_average: tuple[str, str]  # just before the upgrade, just after
    per_day: list[tuple[Any, ...]]
    differences: list[str] = field(default_factory=list)


def old_revision(url: URL) -> str:
    """The revision before the migration: the old schema."""
    down = ScriptDirectory.from_config(alembic_config(url)).get_revision(MIGRATION).down_revision
    assert isinstance(down, str), "the migration follows one revision"
    return down


def load_old_month(url: URL, month: Month) -> None:
    """The month in the old schema's tables, an hour per statement and commit, then vacuumed and analysed
    as autovacuum leaves a server's tables."""
    since = month.end - timedelta(days=month.days)
    with psycopg.connect(dsn(url), autocommit=True) as connection:
        # The raw days' partitions (and today's); the old roll-up dropped the older days'.
        partition_days_from(connection, month.end - timedelta(days=month.raw_days), month.raw_days + 1)
        connection.execute("SET jit = off")  # generate_series makes each statement look costly
        for start, end in hours(since, month.end):
            connection.execute(
                _OLD_HOUR,
                {
                    **FIGURES,
                    "pods": month.pods,
                    "namespaces": month.namespaces,
                    "unit": UNIT,
                    "step": STEP,
                    "window_start": start,
                    "window_end": end,
                    "raw_from": month.raw_from,
                },
            )
        connection.execute(
            "VACUUM (ANALYZE) usage_ledger, usage_hourly, pod_coverage, usage_totals, usage_burn"
        )


def charged(url: URL, rows: str) -> Charged:
    """The charge as `rows` (_BEFORE, _AFTER or _FOLDED) hold it."""
    with psycopg.connect(dsn(url)) as connection:
        connection.execute("SET jit = off")

        def fetch(query: str) -> list[tuple[Any, ...]]:
            return list(connection.execute(query.replace("{rows}", rows)).fetchall())

        return Charged(
            fetch(_PER_DAY),
            fetch(_PER_POD),
            {table: fetch(query) for table, query in _UNTOUCHED.items()},
            fetch(_PER_MONTH),
        )


def count(url: URL, table: str) -> int:
    with psycopg.connect(dsn(url)) as connection:
        row = connection.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def first_difference(name: str, before: list[tuple[Any, ...]], after: list[tuple[Any, ...]]) -> str | None:
    if before == after:
        return None
    first = next((x, y) for x, y in itertools.zip_longest(before, after) if x != y)
    return f"{name}: {len(before)} rows before, {len(after)} after; first difference {first[0]} -> {first[1]}"


def migrate_month(url: URL, month: Month) -> Migrated:
    """The old schema on an empty database, the month loaded into it, `alembic upgrade` timed (the
    migration, then the revisions after it to head), and the charge compared before and after."""
    config = alembic_config(url)
    command.upgrade(config, old_revision(url))
    began = time.perf_counter()
    load_old_month(url, month)
    loaded = time.perf_counter() - began
    raw_rows, hourly_rows = count(url, "usage_ledger"), count(url, "usage_hourly")
    progress(f"loaded {raw_rows:,} raw rows and {hourly_rows:,} hourly rows in {loaded:.0f} s")
    before = charged(url, _BEFORE)
    load_before = _load_average()
    began = time.perf_counter()
    command.upgrade(config, MIGRATION)
    migration = time.perf_counter() - began
    load_after = _load_average()
    progress(f"migration {MIGRATION}: {migration:.1f} s")
    began = time.perf_counter()
    command.upgrade(config, "head")
    head = time.perf_counter() - began
    after = charged(url, _AFTER)
    result = Migrated(
        raw_rows,
        hourly_rows,
        count(url, "usage_pod_hours"),
        loaded,
        migration,
        head,
        (load_before, load_after),
        after.per_day,
    )
    compared = [
        first_difference("charge per namespace and day", before.per_day, after.per_day),
        first_difference("charged time per pod", before.per_pod, after.per_pod),
        *(first_difference(table, before.untouched[table], after.untouched[table]) for table in _UNTOUCHED),
        *(
            f"GPU-minutes charged differ from usage_totals {when}: (namespace, month, charged, total) "
            f"{differing[0]}"
            for when, differing in (("before", before.totals_differ), ("after", after.totals_differ))
            if differing
        ),
    ]
    result.differences = [difference for difference in compared if difference]
    return result


@dataclass
class RolledUp:
    """The roll-up's first run after the upgrade."""

    seconds: float
    hours: int  # hours folded
    pod_hours: int  # pod-hours folded
    pod_days: int  # pod-day rows after
    raw_rows_deleted: int
    differences: list[str] = field(default_factory=list)


def first_rollup(url: URL, month: Month) -> RolledUp:
    """The roll-up run once at the month's end on the upgraded month, timed: every hour older than
    TIMEKEEPER_HOURLY_HISTORY folded into pod-days, the raw rows past the raw window pruned. The charge
    compared before and after, but for the reports: a day counts a report once, where hours count it in
    each hour its charge touches (docs/timekeeper.md "Pod-days")."""
    before = charged(url, _AFTER)
    began = time.perf_counter()
    detail = asyncio.run(roll_up_at(url, month.end))
    seconds = time.perf_counter() - began
    after = charged(url, _FOLDED)
    seconds_only = [[row[:4] for row in charge.per_day] for charge in (before, after)]
    compared = [
        first_difference("charge per namespace and day", *seconds_only),
        first_difference("charged time per pod", before.per_pod, after.per_pod),
        *(
            f"GPU-minutes charged differ from usage_totals after the roll-up: {after.totals_differ[0]}"
            for _ in after.totals_differ[:1]
        ),
    ]
    return RolledUp(
        seconds,
        detail["hours_folded"],
        detail["pod_hours_folded"],
        count(url, "usage_pod_days"),
        detail["deleted_rows"],
        [difference for difference in compared if difference],
    )


def _load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def verdict(result: Migrated) -> str:
    namespaces = {row[0] for row in result.per_day}
    minutes = sum((row[3] for row in result.per_day), Decimal(0)) / 60
    return (
        f"every charged second the same after as before, exactly: per namespace and UTC day "
        f"({len(result.per_day)} namespace-days in {len(namespaces)} namespaces, {minutes:,.2f} GPU-minutes "
        "in all; before: the old hourly rows and the raw rows split at the hours, after: the pod-hour "
        "aggregates under their pod's namespace) in seconds, GPU-seconds and reports counted per hour; "
        "each pod's charged time (one multirange) the same; the GPU-minutes per namespace and month "
        "equal to usage_totals' before and after; usage_totals, usage_burn and pod_coverage (but its new "
        "key) untouched"
    )


def write(month: Month, result: Migrated, rolled: RolledUp, command_line: str) -> None:
    section = SECTION.format(pods=month.pods)
    lines = [
        section,
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M UTC} by `{command_line}` on {machine_description()}. "
        f"{month.pods:,} GPU pods in {month.namespaces} namespaces, a report each every {STEP} s, pods "
        f"replaced every {UNIT // 3600}-{8 * UNIT // 3600} h (bench/history.py's pods), {month.days} days "
        f"held in the schema before `{MIGRATION}` as the old default left them: the last {month.raw_days} "
        "days as raw ledger rows in their day partitions (from the report ending on the old roll-up's cutoff "
        "on), the older ones as the old roll-up's hourly rows (written directly in its shape, a row per pod "
        "and hour segment), then vacuumed and analysed.",
        conditions(result.load_average),
        "",
        "| figure | value |",
        "|---|---|",
        f"| raw ledger rows before | {result.raw_rows:,} |",
        f"| old hourly rows (usage_hourly) before | {result.hourly_rows:,} |",
        f"| pod-hour aggregates (usage_pod_hours) after | {result.aggregate_rows:,} |",
        f"| `alembic upgrade {MIGRATION}` s | {result.migration_seconds:,.1f} |",
        f"| the revisions after it, to head, s | {result.head_seconds:,.1f} |",
        f"| the roll-up's first run after the upgrade, s | {rolled.seconds:,.1f} |",
        f"| hours it folded into pod-days | {rolled.hours:,} |",
        f"| pod-hours folded / pod-days after | {rolled.pod_hours:,} / {rolled.pod_days:,} |",
        f"| raw ledger rows it pruned | {rolled.raw_rows_deleted:,} |",
        "",
        f"- {verdict(result)}",
        "- the roll-up's first run after the upgrade, at the month's end, folds every hour older than "
        "TIMEKEEPER_HOURLY_HISTORY (2 days) into pod-days, one statement and transaction an hour, and prunes "
        "the raw rows past the raw window (an hour): after it, read through usage_history as every reader "
        "reads, every charged second the same per namespace and UTC day (seconds and GPU-seconds; a day "
        "counts a report once where hours counted it in each hour it touched), each pod's charged time the "
        "same, and the GPU-minutes per namespace and month equal to usage_totals'",
        f"- the month loaded in {result.load_seconds:.0f} s (an hour per statement); the load average above "
        "is the upgrade's: just before it and just after",
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=100, help="GPU pods at any time (default 100)")
    parser.add_argument("--namespaces", type=int, default=0, help="default: one per 50 pods, at least 4")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--raw-days", type=int, default=7, help="the old rollup_retention (default 7 days)")
    args = parser.parse_args()
    end = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    month = Month(args.pods, args.namespaces or max(4, args.pods // 50), end, args.days, args.raw_days)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the private server stops on a kill too
    with postgres_server() as server:
        with psycopg.connect(dsn(server), autocommit=True) as connection:
            connection.execute("CREATE DATABASE migrate_history")
        url = server.set(database="migrate_history")
        result = migrate_month(url, month)
        if result.differences:
            raise SystemExit("the charge differs after the migration:\n" + "\n".join(result.differences))
        progress("the roll-up's first run after the upgrade")
        rolled = first_rollup(url, month)
    if rolled.differences:
        raise SystemExit("the charge differs after the first roll-up:\n" + "\n".join(rolled.differences))
    write(
        month,
        result,
        rolled,
        "make bench-migrate-history" + (f" ARGS='{' '.join(sys.argv[1:])}'" if sys.argv[1:] else ""),
    )
    print(
        f"migration {MIGRATION}: {result.migration_seconds:.1f} s for {result.raw_rows:,} raw rows and "
        f"{result.hourly_rows:,} hourly rows -> {result.aggregate_rows:,} aggregates; {verdict(result)}; "
        f"the first roll-up after it: {rolled.seconds:.1f} s, {rolled.hours:,} hours folded into "
        f"{rolled.pod_days:,} pod-days"
    )


if __name__ == "__main__":
    main()
