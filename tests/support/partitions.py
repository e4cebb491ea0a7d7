"""A fresh (empty) ledger's partitions laid out for a simulated clock: the migration bounds the
pre-partitioning partition at the real tomorrow, so days in the past get day partitions of their own
only when it is re-created to end earlier."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg


def partition_days_from(db: psycopg.Connection[Any], first: datetime, days: int) -> None:
    """usage_ledger_before ends at `first` (a UTC midnight); a day partition for each of `days` days
    from there on (those the migration made already are kept)."""
    assert db.execute("SELECT count(*) FROM usage_ledger").fetchone() == (0,), "only an empty ledger"
    db.execute("DROP TABLE usage_ledger_before")
    db.execute(
        "CREATE TABLE usage_ledger_before PARTITION OF usage_ledger "
        f"FOR VALUES FROM (MINVALUE) TO ('{first.isoformat()}')"
    )
    for n in range(days):
        day = first + timedelta(days=n)
        db.execute(
            f"CREATE TABLE IF NOT EXISTS usage_ledger_p{day:%Y%m%d} PARTITION OF usage_ledger "
            f"FOR VALUES FROM ('{day.isoformat()}') TO ('{(day + timedelta(days=1)).isoformat()}')"
        )
