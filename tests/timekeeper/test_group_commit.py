"""Group commit: reports queued together are charged in one transaction, each answered on its own; a
refused report does not fail the others, and a pod's two reports in one queue are charged one after the
other, never twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, async_sessionmaker

from tests.support.timekeeper import report_body
from tests.timekeeper.conftest import START
from timekeeper.clock import ManualClock
from timekeeper.errors import TimekeeperError
from timekeeper.metrics import Metrics
from timekeeper.settings import Settings
from timekeeper.usage.batcher import IngestBatcher
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import IngestOutcome

pytestmark = pytest.mark.asyncio(loop_scope="session")

T0 = START - timedelta(hours=2)


def report(
    pod_uid: str, seq: int, start_minute: float, minutes: float, namespace: str = "team-a"
) -> ReportIn:
    body = report_body(
        namespace=namespace,
        pod=pod_uid,
        pod_uid=pod_uid,
        seq=seq,
        start=T0 + timedelta(minutes=start_minute),
        minutes=minutes,
        gpu_share=1,
    )
    return ReportIn.model_validate(body)


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
async def batcher(
    connection: AsyncConnection, settings: Settings, clock: ManualClock, metrics: Metrics
) -> AsyncIterator[IngestBatcher]:
    """One batch at a time on the test's connection (which a second concurrent batch could not share)."""
    sessions = async_sessionmaker(
        bind=connection, expire_on_commit=False, join_transaction_mode="create_savepoint"
    )
    batcher = IngestBatcher(lambda: sessions, settings, clock, metrics, in_flight=1)
    yield batcher
    await batcher.aclose()


async def charge_together(
    batcher: IngestBatcher, reports: list[ReportIn]
) -> list[IngestOutcome | BaseException]:
    """Queue every report before the batcher starts, so they meet in the first batch it takes."""
    submitted = [asyncio.ensure_future(batcher.submit(r)) for r in reports]
    await asyncio.sleep(0)
    batcher.start()
    return await asyncio.gather(*submitted, return_exceptions=True)


async def test_a_refused_report_fails_alone_and_the_rest_of_its_batch_is_charged(
    batcher: IngestBatcher, connection: AsyncConnection
) -> None:
    [first] = await charge_together(batcher, [report("uid-shared", 1, 0, 1)])
    assert isinstance(first, IngestOutcome)

    outcomes = await asyncio.gather(
        batcher.submit(report("uid-shared", 2, 1, 1, namespace="team-b")),
        *(batcher.submit(report(f"uid-{i}", 1, 0, 2)) for i in range(5)),
        return_exceptions=True,
    )

    refused, *charged = outcomes
    assert isinstance(refused, TimekeeperError) and refused.status_code == 409
    assert [(o.duplicate, o.gpu_minutes) for o in charged if isinstance(o, IngestOutcome)] == [
        (False, Decimal(2))
    ] * 5
    ledger = await connection.execute(sa.text("SELECT count(*), sum(gpu_minutes) FROM usage_ledger"))
    assert ledger.one() == (6, Decimal(11))


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_a_pods_overlapping_reports_queued_together_are_charged_once(
    batcher: IngestBatcher, connection: AsyncConnection, metrics: Metrics
) -> None:
    outcomes = await charge_together(
        batcher,
        [report("uid-a", 1, 0, 2), report("uid-a", 2, 1, 2), report("uid-a", 1, 0, 2)],
    )

    assert [(o.duplicate, o.gpu_minutes) for o in outcomes if isinstance(o, IngestOutcome)] == [
        (False, Decimal(2)),
        (False, Decimal(1)),
        (True, Decimal(0)),
    ]
    covered = await connection.execute(
        sa.text("SELECT sum(upper(r) - lower(r)) FROM usage_ledger, unnest(charged) AS r")
    )
    assert covered.scalar_one() == timedelta(minutes=3)
    # One report per pod in a batch: three batches, none of which failed (two reports of one pod in one
    # batch would fail it, and the retry one by one would hide that in the figures above).
    assert sample(metrics, "timekeeper_ingest_batch_reports_count") == 3
    assert sample(metrics, "timekeeper_ingest_batch_failures_total", reason="refused") == 0


async def test_a_report_the_database_refuses_fails_alone_and_its_batch_is_retried_once(
    batcher: IngestBatcher, connection: AsyncConnection, metrics: Metrics
) -> None:
    # Past validation nothing should reach the database that it refuses; a NUL in a pod name (text
    # cannot hold it) stands for whatever might.
    poison = report("uid-poison", 1, 0, 1).model_copy(update={"pod": "bad\x00pod"})
    good = [report(f"uid-{i}", 1, 0, 2) for i in range(5)]

    outcomes = await charge_together(batcher, [good[0], poison, *good[1:]])

    refused = outcomes.pop(1)
    assert not isinstance(refused, IngestOutcome | TimekeeperError)  # the database's own error, a 500
    assert [(o.duplicate, o.gpu_minutes) for o in outcomes if isinstance(o, IngestOutcome)] == [
        (False, Decimal(2))
    ] * 5
    # The batch of six, then each report once on its own: one retry for every good report.
    assert sample(metrics, "timekeeper_ingest_batch_reports_count") == 1 + 6
    assert sample(metrics, "timekeeper_ingest_batch_failures_total", reason="refused") == 2
    ledger = await connection.execute(sa.text("SELECT count(*), sum(gpu_minutes) FROM usage_ledger"))
    assert ledger.one() == (5, Decimal(10))


async def test_a_batch_writes_a_namespace_state_only_when_it_changes(
    batcher: IngestBatcher, connection: AsyncConnection
) -> None:
    await connection.execute(
        sa.text(
            "INSERT INTO namespace_budgets (namespace, budget_gpu_minutes, period, warn_at_fraction, "
            "updated_at, updated_by) VALUES ('team-a', 10, 'monthly', 0.8, now(), 'test')"
        )
    )
    state_writes: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if "INSERT INTO namespace_status" in statement:
            state_writes.append(statement)

    sa.event.listen(connection.sync_connection, "before_cursor_execute", count)
    try:
        [first] = await charge_together(batcher, [report("uid-a", 0, 0, 3)])
        second = await batcher.submit(report("uid-a", 1, 3, 3))
        third = await batcher.submit(report("uid-a", 2, 6, 3))
    finally:
        sa.event.remove(connection.sync_connection, "before_cursor_execute", count)

    # 3 of 10 minutes: first seen, in budget (written); 6: in budget still (nothing written); 9: warning.
    assert [o.state for o in (first, second, third) if isinstance(o, IngestOutcome)] == [
        "in_budget",
        "in_budget",
        "warning",
    ]
    assert len(state_writes) == 2
    stored = await connection.execute(
        sa.text("SELECT state FROM namespace_status WHERE namespace = 'team-a'")
    )
    assert stored.scalar_one() == "warning"
