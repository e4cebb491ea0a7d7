"""One migrated database per run (alembic upgrade head, once); each test inside a transaction that is
rolled back at the end; the app called in-process through httpx.ASGITransport, built once per settings
and started afresh (state, metrics, lifespan) for every test."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, async_sessionmaker
from starlette.datastructures import State

from tests.support.postgres import url_string
from tests.support.timekeeper import Api, Tokens, migrated_database
from timekeeper.app import create_app
from timekeeper.clock import ManualClock
from timekeeper.db.session import build_engine
from timekeeper.metrics import Metrics
from timekeeper.settings import Settings

# Mid-month, mid-week, midday: far from every period boundary unless a test moves there.
START = datetime(2026, 3, 18, 12, 0, tzinfo=UTC)


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
    # The scheduler's jobs are driven directly by tests/timekeeper/test_scheduler*.py.
    return Settings(database_url=url_string(database_url), scheduler_enabled=False, **tokens.settings())


@pytest.fixture
async def connection(database_url: URL) -> AsyncIterator[AsyncConnection]:
    engine = build_engine(url_string(database_url), pool_size=1)
    async with engine.connect() as connection:
        transaction = await connection.begin()
        yield connection
        await transaction.rollback()
    await engine.dispose()


class BuiltApps:
    """The last few apps create_app built, by their settings, each with its state as built. FastAPI
    resolves every route's dependencies and models on an app's first requests, which cost more than most
    tests; an app is code and settings, so tests with the same settings share one."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self.built: OrderedDict[str, tuple[FastAPI, dict[str, object]]] = OrderedDict()

    def fresh(self, settings: Settings, clock: ManualClock) -> FastAPI:
        """The app for these settings, its state reset to what create_app gave it (tests replace
        settings, access and sessionmakers in it), with this test's clock and metrics counted from zero."""
        key = settings.model_dump_json()
        if key not in self.built:
            app = create_app(settings, clock)
            self.built[key] = (app, dict(app.state._state))
            while len(self.built) > self.keep:
                self.built.popitem(last=False)
        self.built.move_to_end(key)
        app, state = self.built[key]
        app.state = State({**state, "clock": clock, "metrics": Metrics()})
        return app


@pytest.fixture(scope="session")
def built_apps() -> BuiltApps:
    return BuiltApps()


@pytest.fixture
async def app(
    settings: Settings, clock: ManualClock, connection: AsyncConnection, built_apps: BuiltApps
) -> AsyncIterator[FastAPI]:
    app = built_apps.fresh(settings, clock)
    async with app.router.lifespan_context(app):
        # Every request's session joins the test's transaction; its commit only releases a savepoint.
        app.state.sessionmaker = async_sessionmaker(
            bind=connection, expire_on_commit=False, join_transaction_mode="create_savepoint"
        )
        # Reads too (in production they run in autocommit; tests/timekeeper/test_reads.py checks that).
        app.state.read_sessionmaker = app.state.sessionmaker
        # And chargeback exports (in production on a pool of their own: tests/timekeeper/test_chargeback.py).
        app.state.export_sessionmaker = app.state.sessionmaker
        yield app


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://timekeeper/api/v1") as client:
        yield client


@pytest.fixture
def api(client: httpx.AsyncClient, tokens: Tokens) -> Api:
    return Api(client, tokens)
