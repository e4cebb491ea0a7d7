"""bench-history's bulk loader: its windows, and its proof (a sample through POST /reports and through the
loader, equal row by row) on the test PostgreSQL, so a change to ingest's shapes fails here first."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from bench.history import prove, windows
from tests.support.postgres import drop_database, server_url


def test_windows_are_cut_at_each_utc_midnight() -> None:
    since = datetime(2026, 1, 1, 23, 15, tzinfo=UTC)
    cuts = windows(since, since + timedelta(days=1, minutes=150))
    midnight = int(datetime(2026, 1, 2, tzinfo=UTC).timestamp())
    assert cuts == [
        (midnight - 45 * 60, midnight),
        (midnight, midnight + 86_400),
        (midnight + 86_400, midnight + 86_400 + 6300),
    ]
    assert windows(since, since) == []


def test_the_loader_writes_what_ingest_writes() -> None:
    name = f"gtk_test_proof_{uuid.uuid4().hex[:8]}"
    since = datetime.now(UTC).replace(hour=23, minute=15, second=0, microsecond=0) - timedelta(days=3)
    try:
        _, verdict = prove(server_url(), since, name)
    finally:
        for kept in ("ingest", "bulk", "window"):
            drop_database(server_url().set(database=f"{name}_{kept}"))
    assert "equal row by row" in verdict
    assert "lives crossing an hour" in verdict
    assert "every pod-hour folded, usage_pod_days equal" in verdict
