"""Concurrent reports in real, separate transactions: nothing lost, nothing charged twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from decimal import Decimal

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from tests.support.postgres import url_string
from tests.support.timekeeper import Api, Tokens, migrated_database, ok
from tests.timekeeper.conftest import START
from timekeeper.app import create_app
from timekeeper.clock import ManualClock
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

WRITERS = 50
REPORTS_EACH = 4
SHARE = 0.25


@pytest.fixture(scope="module")
def committed_database() -> Iterator[URL]:
    """A database of its own: these tests commit for real, so they cannot share the rolled-back one."""
    with migrated_database("gtk_concurrency") as url:
        yield url


@pytest.fixture
async def concurrent_api(committed_database: URL, tokens: Tokens) -> AsyncIterator[Api]:
    settings = Settings(
        database_url=url_string(committed_database), database_pool_size=10, **tokens.settings()
    )
    app = create_app(settings, ManualClock(START))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://timekeeper/api/v1") as client:
            yield Api(client, tokens)


async def test_fifty_concurrent_writers_to_one_namespace_lose_no_update(
    concurrent_api: Api, committed_database: URL
) -> None:
    api = concurrent_api
    ok(await api.put_budget("crowded", budget_gpu_minutes=WRITERS * REPORTS_EACH * SHARE / 2))
    first = START - timedelta(hours=1)

    async def writer(index: int) -> list[dict]:
        acks = []
        for seq in range(REPORTS_EACH):
            fields = dict(
                namespace="crowded",
                pod=f"worker-{index}",
                pod_uid=f"uid-crowded-{index}",
                seq=seq,
                start=first + timedelta(minutes=seq),
                minutes=1,
                gpu_share=SHARE,
            )
            # Each report sent twice at once, as a sidecar retrying a timed-out send would.
            acks.extend(ok(r) for r in await asyncio.gather(api.report(**fields), api.report(**fields)))
        return acks

    acks = [ack for acks in await asyncio.gather(*(writer(i) for i in range(WRITERS))) for ack in acks]

    expected = Decimal(WRITERS * REPORTS_EACH) * Decimal(str(SHARE))
    assert sum(ack["duplicate"] for ack in acks) == WRITERS * REPORTS_EACH
    assert sum(Decimal(str(ack["gpu_minutes"])) for ack in acks) == expected
    status = await api.budget("crowded")
    assert Decimal(str(status["used_gpu_minutes"])) == expected
    assert status["state"] == "exhausted"
    engine = sa.create_engine(url_string(committed_database), poolclass=sa.NullPool)
    with engine.connect() as connection:
        ledger = connection.execute(
            sa.text("SELECT count(*), sum(gpu_minutes) FROM usage_ledger WHERE namespace = 'crowded'")
        ).one()
        stored_state = connection.execute(
            sa.text("SELECT state FROM namespace_status WHERE namespace = 'crowded'")
        ).scalar_one()
    engine.dispose()
    assert (ledger[0], ledger[1]) == (WRITERS * REPORTS_EACH, expected)
    assert stored_state == "exhausted"
