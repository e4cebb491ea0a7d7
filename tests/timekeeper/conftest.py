"""One migrated database per run (alembic upgrade head, once); each test inside a transaction that is
rolled back at the end; the app called in-process through httpx.ASGITransport, built once per settings
and given a context of its own (engines, metrics, batcher, this test's clock and sessions) in every test."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, async_sessionmaker

from tests.support.postgres import url_string
from tests.support.timekeeper import Api, Tokens, migrated_database
from timekeeper.app import create_app, expose, run_context
from timekeeper.clock import ManualClock
from timekeeper.db.session import build_engine
from timekeeper.settings import Settings

# Mid-month, mid-week, midday: far from every period boundary unless a test moves there.
START = datetime(2026, 3, 18, 12, 0, tzinfo=UTC)


RAW_WEEK = timedelta(days=7)


@pytest.fixture(scope="session")
def database_url() -> Iterator[URL]:
    with migrated_database("gtk_timekeeper") as url:
        yield url


@pytest.fixture(scope="session")
def tokens() -> Tokens:
    return Tokens()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def settings(database_url: URL, tokens: Tokens) -> Settings:
    # The scheduler's jobs are driven directly by tests/timekeeper/test_scheduler*.py. Raw ledger rows are
    # kept a week (the default is an hour), so the tests that look at them see their reports' rows.
    return Settings(
        database_url=url_string(database_url),
        scheduler_enabled=False,
        ledger_retention=RAW_WEEK,
        **tokens.settings(),
    )


@pytest.fixture
async def connection(database_url: URL) -> AsyncIterator[AsyncConnection]:
    engine = build_engine(url_string(database_url), pool_size=1)
    async with engine.connect() as connection:
        transaction = await connection.begin()
        yield connection
        await transaction.rollback()
    await engine.dispose()


class BuiltApps:
    """The last few apps create_app built, by their settings. FastAPI resolves every route's dependencies
    and models on an app's first requests, which cost more than most tests; an app is code and settings,
    so tests with the same settings share one (each test runs its own context: timekeeper.app.run_context)."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self.built: OrderedDict[str, FastAPI] = OrderedDict()

    def app(self, settings: Settings) -> FastAPI:
        key = settings.model_dump_json()
        if key not in self.built:
            self.built[key] = create_app(settings)
            while len(self.built) > self.keep:
                self.built.popitem(last=False)
        self.built.move_to_end(key)
        return self.built[key]


@pytest.fixture(scope="session")
def built_apps() -> BuiltApps:
    return BuiltApps()


@asynccontextmanager
async def serving(
    app: FastAPI, settings: Settings, clock: ManualClock, connection: AsyncConnection
) -> AsyncIterator[FastAPI]:
    """The app started, every session of it joined to the test's connection and transaction."""
    async with run_context(app, settings, clock) as context:
        # Every request's session joins the test's transaction; its commit only releases a savepoint.
        sessions = async_sessionmaker(
            bind=connection, expire_on_commit=False, join_transaction_mode="create_savepoint"
        )
        # Reads too (in production they run in autocommit; tests/timekeeper/test_reads.py checks that), and
        # chargeback exports (in production on a pool of their own: tests/timekeeper/test_chargeback.py).
        expose(app, replace(context, sessions=sessions, reads=sessions, export_sessions=sessions))
        yield app


@pytest.fixture
async def app(
    settings: Settings, clock: ManualClock, connection: AsyncConnection, built_apps: BuiltApps
) -> AsyncIterator[FastAPI]:
    async with serving(built_apps.app(settings), settings, clock, connection) as app:
        yield app


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://timekeeper/api/v1") as client:
        yield client


@pytest.fixture
def api(client: httpx.AsyncClient, tokens: Tokens) -> Api:
    return Api(client, tokens)
