"""How PostgreSQL plans the chargeback export's one statement on a large cluster's tables (test_plans.py's,
plus a day of hours a month ago and a week of days before it), as the export runs it: a server-side cursor
(EXPLAIN DECLARE plans it for a cursor, as the export's DECLARE is). No planner setting is changed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.timekeeper.test_plans import (  # noqa: F401 (grown: a fixture)
    READ_WHOLE,
    _scanned,
    empty_partitions,
    grown,
)
from timekeeper.billing.chargeback import chargeback_range
from timekeeper.usage import repository

pytestmark = pytest.mark.asyncio(loop_scope="session")

# A day of hours for every pod of test_plans' ledger, a month ago.
_HOURS = (
    "INSERT INTO usage_pod_hours (pod_key, hour_start, gpu_share, charge_share, model_key, charged, reports) "
    "SELECT c.id, h, 1, 1, 1 + c.id % 20, tstzmultirange(tstzrange(h, h + interval '1 hour')), 120 "
    "FROM pod_coverage c, "
    "generate_series(date_trunc('hour', now()) - interval '30 days', "
    "date_trunc('hour', now()) - interval '29 days 1 hour', interval '1 hour') AS h"
)

# And the days before it, folded: a week of pod-days for every pod.
_DAYS = (
    "INSERT INTO usage_pod_days (pod_key, day_start, gpu_share, charge_share, model_key, charged, reports) "
    "SELECT c.id, d, 1, 1, 1 + c.id % 20, tstzmultirange(tstzrange(d, d + interval '1 day')), 2880 "
    "FROM pod_coverage c, "
    "generate_series(date_trunc('day', now(), 'UTC') - interval '37 days', "
    "date_trunc('day', now(), 'UTC') - interval '31 days', interval '1 day') AS d"
)


async def grow_history(grown: psycopg.AsyncConnection[Any]) -> None:  # noqa: F811
    await grown.execute(_HOURS)
    await grown.execute(_DAYS)
    await grown.execute("ANALYZE usage_pod_hours")
    await grown.execute("ANALYZE usage_pod_days")


async def export_plan(
    connection: AsyncConnection, namespaces: list[str] | None, since: datetime, until: datetime
) -> dict[str, Any]:
    """EXPLAIN of the export's statement declared as a cursor, for daily periods over [since, until)."""
    span = chargeback_range("daily", since, until)
    periods = [(period.start, period.end or until) for period in span.periods]
    explained = await connection.execute(
        sa.text(f"EXPLAIN (FORMAT JSON) DECLARE export CURSOR FOR {repository._USAGE_BY_PERIOD.text}"),
        repository.by_period_parameters(namespaces, periods),
    )
    return dict(explained.scalar_one()[0]["Plan"])


async def test_a_scoped_export_reads_its_namespaces_rows_by_index(
    grown: psycopg.AsyncConnection[Any],  # noqa: F811
    connection: AsyncConnection,
) -> None:
    """A reader of three namespaces out of 10,000 exporting the last 40 days: the pod-hours and pod-days
    of those namespaces' pods by index, no table read whole."""
    await grow_history(grown)
    now = datetime.now(UTC)

    plan = await export_plan(connection, ["ns-7", "ns-42", "ns-9001"], now - timedelta(days=40), now)

    assert not set(_scanned(plan)) - READ_WHOLE - await empty_partitions(grown), plan


async def test_a_check_that_catches_an_export_reading_a_grown_table_whole(
    grown: psycopg.AsyncConnection[Any],  # noqa: F811
    connection: AsyncConnection,
) -> None:
    """The check above fails where the indexes its probes use are gone."""
    await grow_history(grown)
    await grown.execute("ALTER TABLE usage_pod_hours DROP CONSTRAINT uq_usage_pod_hours_key")
    await grown.execute("DROP INDEX ix_usage_pod_hours_hour_start")
    await grown.execute("ANALYZE usage_pod_hours")
    now = datetime.now(UTC)

    plan = await export_plan(connection, ["ns-7", "ns-42", "ns-9001"], now - timedelta(days=40), now)

    # The pod-hours read whole (and with them, as the planner then joins the history by hash, the days).
    assert "usage_pod_hours" in set(_scanned(plan)) - READ_WHOLE - await empty_partitions(grown)
