"""Bytes per raw ledger row, column by column: rows written by bench/history.py's bulk loader with the
figures the ingest code computes for a report, on the test PostgreSQL (TIMEKEEPER_TEST_DATABASE_URL).
`python -m bench.ledger_bytes [--rows N]`; a few seconds, not a load test."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg

from bench.history import STEP, generate
from tests.support.postgres import create_database, drop_database, url_string
from tests.support.timekeeper import migrate, report_body
from timekeeper.usage.measure import measure
from timekeeper.usage.planning import Rate
from timekeeper.usage.repository import batch_json
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import ledger_row

START = datetime(2026, 11, 1, tzinfo=UTC)
# What a GPU entry holds: bench/history.py's report, and a sidecar reading NVML on an H100.
PROFILES: dict[str, dict[str, Any]] = {
    "history": {
        "uuid": "GPU-0",
        "sm_util_pct": 50.0,
        "mem_used_bytes": 1 << 30,
        "mem_total_bytes": 1 << 34,
        "name": "NVIDIA H100 80GB HBM3",
    },
    "nvml": {
        "uuid": "GPU-5d7a8c3e-1b2f-4e6a-9c0d-3f8e7a6b5c4d",
        "sm_util_pct": 47.25,
        "mem_used_bytes": 61203283968,
        "mem_total_bytes": 85520809984,
        "sm_util_max_pct": 99.0,
        "energy_joules": 10523.4,
        "status": "ok",
        "name": "NVIDIA H100 80GB HBM3",
    },
}


def figures(gpu: dict[str, Any]) -> dict[str, Any]:
    """The ledger row's figure columns for a one-GPU report, as ingest writes them (the loader's input)."""
    report = ReportIn.model_validate(report_body(start=START, minutes=STEP / 60, gpus=[gpu]))
    row = ledger_row(report, measure(report), Decimal(1), Decimal(1), Rate(Decimal(1)), "NVIDIA-H100")
    columns = ("mean_sm_util_pct", "peak_sm_util_pct", "mem_used_bytes")
    return {
        **{column: row.get(column) for column in columns},
        "gpus": batch_json(row["gpus"]),
        "mean_power_w": row["mean_power_w"],
        "gpu_status_bits": row["gpu_status_bits"],
        "gpu_model": row["gpu_model"],
    }


def measure_bytes(dsn: str) -> tuple[float, float, float, dict[str, float]]:
    """(table, indexes, data bytes per row, the mean bytes of each column)."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("VACUUM ANALYZE usage_ledger")
        names = [
            row[0]
            for row in connection.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'usage_ledger'::regclass AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum"
            )
        ]
        means = ", ".join(f"avg(coalesce(pg_column_size(l.{name}), 0))" for name in names)
        row = connection.execute(
            "SELECT count(*), pg_table_size('usage_ledger'), pg_indexes_size('usage_ledger'), "
            f"avg(pg_column_size(l.*)), {means} FROM usage_ledger l"
        ).fetchone()
    assert row is not None and row[0], "the loader wrote rows"
    count = row[0]
    return row[1] / count, row[2] / count, float(row[3]), dict(zip(names, map(float, row[4:]), strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--pods", type=int, default=100)
    args = parser.parse_args()
    until = START + timedelta(seconds=STEP * -(-args.rows // args.pods))
    for profile, gpu in PROFILES.items():
        url = create_database("gtk_ledger_bytes")
        try:
            migrate(url)
            dsn = url_string(url).replace("postgresql+psycopg", "postgresql")
            generate(dsn, figures(gpu), args.pods, 4, START, until, 6 * 3600)
            table, indexes, data, columns = measure_bytes(dsn)
        finally:
            drop_database(url)
        pod_day = (table + indexes) * 24 * 3600 / STEP
        print(
            f"{profile}: per row table {table:.0f} B + indexes {indexes:.0f} B "
            f"({pod_day:,.0f} B per pod-day), data {data:.0f} B; "
            + ", ".join(f"{name} {size:.1f}" for name, size in columns.items())
        )


if __name__ == "__main__":
    main()
