"""CPU per report spent in the timekeeper's ASGI stack alone (middleware, routing, auth, validation, answer),
the batcher answering at once: the request handling without uvicorn, SQL or wrk. Needs no database."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import secrets
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import orjson

from bench.common import asgi_caller
from tests.support.timekeeper import report_body
from timekeeper.app import create_app, expose
from timekeeper.auth.dependencies import ACCESS
from timekeeper.auth.factory import build_access_control
from timekeeper.budgets.states.repository import known_namespaces
from timekeeper.context import Context
from timekeeper.db.session import build_engine, build_sessionmaker
from timekeeper.metrics import METRICS, Metrics
from timekeeper.settings import Settings
from timekeeper.usage.router import INGEST, POD_SHARES
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import IngestOutcome


class InstantBatcher:
    """Stands in for the IngestBatcher: every report is answered as charged, without a database."""

    async def submit(self, report: ReportIn) -> IngestOutcome:
        return IngestOutcome(duplicate=False, gpu_minutes=Decimal("0.25"), state="in_budget")


async def cpu_per_report(requests: int) -> float:
    """Microseconds of this process's CPU per POST /api/v1/reports answered 200."""
    token = secrets.token_urlsafe(24)
    settings = Settings(
        database_url="postgresql+psycopg://unused@127.0.0.1/unused",
        reporter_token_sha256=hashlib.sha256(token.encode()).hexdigest(),
    )
    app = create_app(settings)
    engine = build_engine(settings.database_url or "")  # never connected
    sessions = build_sessionmaker(engine)
    access, ingest = await build_access_control(settings), InstantBatcher()
    context = Context(
        settings=settings,
        clock=settings.clock(),
        engine=engine,
        sessions=sessions,
        reads=sessions,
        export_engine=engine,
        export_sessions=sessions,
        known_namespaces=known_namespaces,
        scheduler=None,
        parts={ACCESS: access, METRICS: Metrics(), INGEST: ingest, POD_SHARES: None},
    )
    expose(app, context)
    body = orjson.dumps(report_body(start=datetime.now(UTC) - timedelta(hours=1)))
    call = asgi_caller(app, "/api/v1/reports", body, [(b"authorization", f"Bearer {token}".encode())])
    for _ in range(requests // 10):  # warm-up
        await call()
    started = time.process_time()
    for _ in range(requests):
        await call()
    used = time.process_time() - started
    return 1e6 * used / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=5000)
    args = parser.parse_args()
    print(f"ASGI stack CPU per report: {asyncio.run(cpu_per_report(args.requests)):.0f} µs")


if __name__ == "__main__":
    main()
