"""bench-migrate-history's core at a tiny size on the test PostgreSQL, so the benchmark cannot rot: the old
schema's month keeps every charged second through the upgrade, and the old roll-up's rows it writes
directly are the aggregates the migration's own fold makes of the same reports held raw, and the roll-up's
first run after it folds the old hours into pod-days keeping every charged second."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bench.common import dsn
from bench.migrate_history import STEP, Migrated, Month, first_rollup, migrate_month
from tests.support.postgres import create_database, drop_database

_AGGREGATES = (
    "SELECT c.pod_uid, h.hour_start, h.gpu_share, h.charge_share, m.name, h.charged::text, h.reports, "
    "h.reports_continued, h.util_seconds, h.util_covered_seconds, h.peak_sm_util_pct, h.mem_byte_seconds, "
    "h.mem_covered_seconds, h.peak_mem_used_bytes, h.energy_joules, h.gpu_status_bits "
    "FROM usage_pod_hours h JOIN pod_coverage c ON c.id = h.pod_key "
    "LEFT JOIN usage_models m ON m.id = h.model_key ORDER BY 1, 2, 3, 4, 5"
)


def _migrated(month: Month) -> tuple[Migrated, list[tuple[Any, ...]]]:
    url = create_database("gtk_test_migrate_history")
    try:
        result = migrate_month(url, month)
        with psycopg.connect(dsn(url)) as connection:
            aggregates = connection.execute(_AGGREGATES).fetchall()
    finally:
        drop_database(url)
    return result, aggregates


def test_the_upgrade_keeps_every_charged_second_of_the_old_schemas_month() -> None:
    end = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    pods, days = 4, 3
    result, aggregates = _migrated(Month(pods, 2, end, days=days, raw_days=1))
    assert result.differences == []
    # A day of reports raw, and the one ending on the old roll-up's cutoff.
    assert result.raw_rows == pods * (24 * 3600 // STEP + 1)
    assert result.hourly_rows >= pods * 24 * (days - 1)
    assert result.aggregate_rows == len(aggregates) >= pods * 24 * days
    assert [(row[0], row[1].date()) for row in result.per_day] == [
        (namespace, (end - timedelta(days=day)).date()) for namespace in ("ns-0", "ns-1") for day in (3, 2, 1)
    ]

    # The same month with every report raw: the migration folds them all into the same aggregates.
    folded, all_raw = _migrated(Month(pods, 2, end, days=days, raw_days=days))
    assert folded.hourly_rows == 0 and folded.differences == []
    assert all_raw == aggregates


def test_the_first_rollup_after_the_upgrade_folds_the_old_hours_and_keeps_every_charged_second() -> None:
    end = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    month = Month(4, 2, end, days=3, raw_days=1)
    url = create_database("gtk_test_migrate_history")
    try:
        assert migrate_month(url, month).differences == []
        rolled = first_rollup(url, month)
        with psycopg.connect(dsn(url)) as connection:
            hours = connection.execute("SELECT min(hour_start), count(*) FROM usage_pod_hours").fetchone()
    finally:
        drop_database(url)
    assert rolled.differences == []
    # The month's first day is past TIMEKEEPER_HOURLY_HISTORY (2 days): its 24 hours are days now.
    assert rolled.hours == 24 and rolled.pod_hours >= 4 * 24
    assert 4 <= rolled.pod_days < rolled.pod_hours
    assert hours is not None and hours[0] == end - timedelta(days=2) and hours[1] >= 4 * 24 * 2
    # Raw rows past the raw window (an hour) are pruned; the rest of their day goes with its partition.
    assert rolled.raw_rows_deleted > 0
