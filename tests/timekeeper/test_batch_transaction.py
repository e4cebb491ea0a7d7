"""A batch on the pool's own connections (not the tests' joined transaction): its transaction is begun by
its read pipeline, not by psycopg's BEGIN round trip, and still commits or rolls back whole."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import pq
from psycopg._connection_base import BaseConnection
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.postgres import url_string
from tests.support.timekeeper import migrated_database, report_body
from tests.timekeeper.conftest import START
from timekeeper.clock import ManualClock
from timekeeper.db.session import build_engine, build_sessionmaker
from timekeeper.errors import TimekeeperError
from timekeeper.metrics import Metrics
from timekeeper.settings import Settings
from timekeeper.usage.batcher import IngestBatcher
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import IngestOutcome

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module")
def committed_database() -> Iterator[URL]:
    """A database of its own: these batches commit for real."""
    with migrated_database("gtk_batch_transaction") as url:
        yield url


@pytest.fixture
async def engine(committed_database: URL) -> AsyncIterator[AsyncEngine]:
    engine = build_engine(url_string(committed_database), pool_size=1, max_overflow=0)
    yield engine
    await engine.dispose()


@pytest.fixture
async def batcher(engine: AsyncEngine) -> AsyncIterator[IngestBatcher]:
    sessions = build_sessionmaker(engine)
    settings = Settings(database_url="postgresql+psycopg://unused@127.0.0.1/unused")
    batcher = IngestBatcher(lambda: sessions, settings, ManualClock(START), Metrics(), in_flight=1)
    batcher.start()
    yield batcher
    await batcher.aclose()


def report(namespace: str, pod: str, seq: int) -> ReportIn:
    body = report_body(
        namespace=namespace,
        pod=pod,
        pod_uid=f"uid-{namespace}-{pod}",
        seq=seq,
        start=START - timedelta(hours=1) + timedelta(minutes=seq),
        minutes=1,
        gpu_share=1,
    )
    return ReportIn.model_validate(body)


async def charge_together(batcher: IngestBatcher, reports: list[ReportIn]) -> list[Any]:
    """Every report queued before the batcher's runner wakes, so they meet in one batch."""
    return await asyncio.gather(*(batcher.submit(r) for r in reports), return_exceptions=True)


@contextmanager
def psycopg_commands() -> Iterator[list[bytes]]:
    """The transaction commands psycopg sends of its own accord (BEGIN, COMMIT, ROLLBACK)."""
    sent: list[bytes] = []
    command = BaseConnection._exec_command

    def recorded(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(bytes(query) if isinstance(query, bytes) else str(query).encode())
        return command(self, query, *args, **kwargs)

    BaseConnection._exec_command = recorded  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        BaseConnection._exec_command = command  # type: ignore[method-assign]


async def ledger(engine: AsyncEngine, namespace: str) -> tuple[int, Decimal | None]:
    async with engine.connect() as connection:
        found = await connection.execute(
            sa.text("SELECT count(*), sum(gpu_minutes) FROM usage_ledger WHERE namespace = :ns"),
            {"ns": namespace},
        )
        count, total = found.one()
        return count, total


async def pooled_connection_state(engine: AsyncEngine) -> tuple[bool, pq.TransactionStatus]:
    """The pool's one connection as the next checkout finds it: autocommit, and the server's state."""
    async with engine.connect() as connection:
        raw = await connection.get_raw_connection()
        driver = raw.driver_connection
        assert isinstance(driver, psycopg.AsyncConnection)
        return driver.autocommit, driver.info.transaction_status


async def test_a_batch_begins_in_its_read_and_psycopg_sends_only_the_commit(
    batcher: IngestBatcher, engine: AsyncEngine
) -> None:
    [first] = await charge_together(batcher, [report("tx-a", "warm", 0)])  # the pool's connection made
    assert isinstance(first, IngestOutcome)

    with psycopg_commands() as sent:
        outcomes = await charge_together(batcher, [report("tx-a", f"pod-{i}", 1) for i in range(5)])

    assert [(o.duplicate, o.gpu_minutes) for o in outcomes] == [(False, Decimal(1))] * 5
    assert sent == [b"COMMIT"]  # before: BEGIN (a round trip of its own in pipeline mode), COMMIT
    assert await ledger(engine, "tx-a") == (6, Decimal(6))
    # Back in the pool as SQLAlchemy checked it out: outside autocommit, no transaction open.
    assert await pooled_connection_state(engine) == (False, pq.TransactionStatus.IDLE)


async def test_a_batch_refused_after_its_begin_leaves_nothing_and_the_connection_idle(
    batcher: IngestBatcher, engine: AsyncEngine
) -> None:
    [first] = await charge_together(batcher, [report("tx-b", "owner", 0)])
    assert isinstance(first, IngestOutcome)
    # The same pod_uid in another namespace (refused in the read, 409) and text the database refuses
    # (a NUL: the batch's statements fail after BEGIN, so the batch is rolled back and charged again
    # report by report).
    foreign = report("tx-b", "owner", 1).model_copy(update={"namespace": "tx-c"})
    poison = report("tx-b", "poison", 1).model_copy(update={"pod": "bad\x00pod"})
    good = [report("tx-b", f"pod-{i}", 1) for i in range(3)]

    with psycopg_commands() as sent:
        outcomes = await charge_together(batcher, [good[0], foreign, poison, *good[1:]])

    charged, refused, failed, *rest = outcomes
    assert isinstance(refused, TimekeeperError) and refused.status_code == 409
    assert not isinstance(failed, IngestOutcome | TimekeeperError)
    assert [(o.duplicate, o.gpu_minutes) for o in (charged, *rest)] == [(False, Decimal(1))] * 3
    # The batch and the poison's own retry rolled back; the four others each committed alone.
    assert sorted(sent) == [b"COMMIT"] * 4 + [b"ROLLBACK"] * 2
    assert await ledger(engine, "tx-b") == (4, Decimal(4))
    assert await ledger(engine, "tx-c") == (0, None)
    assert await pooled_connection_state(engine) == (False, pq.TransactionStatus.IDLE)
