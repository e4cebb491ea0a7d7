"""The budget reads' connections, plain checkouts from the app's own engine on a database of this module's
own (reads there are not inside a test's transaction): a pooled connection whose backend was terminated
between reads costs no read (the read runs once more on a fresh connection), and a pool member's read
answers its pool's state and gives its connection back."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest
from fastapi import FastAPI
from sqlalchemy.engine import URL

from tests.support.postgres import url_string
from tests.support.timekeeper import Api, Tokens, bearer, migrated_database, ok, report_body
from timekeeper.app import create_app, current
from timekeeper.clock import ManualClock
from timekeeper.metrics import METRICS
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

NOW = datetime(2026, 3, 18, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def own_database() -> Iterator[URL]:
    with migrated_database("gtk_read_connections") as url:
        yield url


@pytest.fixture
async def app(own_database: URL, tokens: Tokens) -> AsyncIterator[FastAPI]:
    settings = Settings(database_url=url_string(own_database), scheduler_enabled=False, **tokens.settings())
    app = create_app(settings, ManualClock(NOW))
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def api(app: FastAPI, tokens: Tokens) -> AsyncIterator[Api]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://timekeeper/api/v1") as client:
        yield Api(client, tokens)


async def terminate_backends(database: URL) -> int:
    """Terminates every backend connected to `database` (as an administrator or a failover would)."""
    dsn = url_string(database.set(database="postgres")).replace("+psycopg", "")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        cursor = await admin.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (database.database,),
        )
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def test_read_connections_terminated_between_reads_cost_no_read(
    app: FastAPI, api: Api, own_database: URL
) -> None:
    """Checkouts are not pinged: a read that meets a connection whose backend was terminated since its
    last read runs once more on a fresh one (timekeeper.db.session.read; a 503 otherwise)."""
    await asyncio.gather(*(api.budget("team-a") for _ in range(3)))  # three connections in the pool

    assert await terminate_backends(own_database) >= 2

    answers = await asyncio.gather(
        *(api.client.get("/namespaces/team-a/budget", headers=bearer(api.tokens.reader)) for _ in range(3))
    )
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    for _ in range(3):
        await api.budget("team-a")
    ok(await api.client.get("/namespaces", headers=bearer(api.tokens.reader)))
    assert current(app)[METRICS].registry.get_sample_value("timekeeper_database_up") == 1


async def test_a_pool_members_read_answers_its_pools_state(app: FastAPI, api: Api) -> None:
    """team-b spent nothing, but the pool it shares with team-a is spent: its read (the pool's figures
    through the ORM) answers exhausted, as the snapshot does, and every connection goes back to the
    pool afterwards."""
    pool = "vision-" + secrets.token_hex(3)
    team_a, team_b = f"{pool}-a", f"{pool}-b"
    body = {
        "budget_gpu_minutes": 100,
        "period": "monthly",
        "members": [{"namespace": ns, "cap_gpu_minutes": None} for ns in (team_a, team_b)],
    }
    ok(await api.client.put(f"/pools/{pool}", json=body, headers=bearer(api.tokens.admin)))
    start = NOW - timedelta(minutes=25)
    spent = report_body(
        namespace=team_a, pod="p", pod_uid="uid-" + pool, start=start, minutes=25, gpu_share=4
    )
    ok(await api.client.post("/reports", json=spent, headers=bearer(api.tokens.reporter)))

    budget = await api.budget(team_b)
    listed = {entry["namespace"]: entry for entry in ok(await api.get("/namespaces"))}
    snapshot = ok(await api.get("/admission-state"))["namespaces"]

    assert (budget["pool"], budget["state"], budget["used_gpu_minutes"]) == (pool, "exhausted", 0)
    assert listed[team_b] == budget
    assert listed[team_a]["state"] == snapshot[team_a]["state"] == snapshot[team_b]["state"] == "exhausted"
    assert current(app).engine.sync_engine.pool.checkedout() == 0
