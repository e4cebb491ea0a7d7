"""CPU per report spent in the timekeeper's ASGI stack alone (middleware, routing, auth, validation, answer),
the batcher answering at once: the request handling without uvicorn, SQL or wrk. Needs no database.
`--callgrind`: exact instructions per report, in all and by part, and through uvicorn beside the bare app."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import http.client
import secrets
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastapi.routing
import orjson
from fastapi import FastAPI
from fastapi._compat.v2 import ModelField

import timekeeper.auth.dependencies
import timekeeper.routing
import timekeeper.usage.router
from bench import callgrind
from bench.common import asgi_caller, free_port
from tests.support.timekeeper import report_body
from timekeeper.app import create_app, expose
from timekeeper.auth.base import AccessControl
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

PATH = "/api/v1/reports"


class InstantBatcher:
    """Stands in for the IngestBatcher: every report is answered as charged, without a database."""

    async def submit(self, report: ReportIn) -> IngestOutcome:
        return IngestOutcome(duplicate=False, gpu_minutes=Decimal("0.25"), state="in_budget")


async def report_app() -> tuple[FastAPI, AccessControl, bytes, str]:
    """The timekeeper's app with a context whose batcher answers at once; a report body and its token."""
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
    return app, access, body, token


async def cpu_per_report(requests: int) -> float:
    """Microseconds of this process's CPU per POST /api/v1/reports answered 200."""
    app, _, body, token = await report_app()
    call = asgi_caller(app, PATH, body, [(b"authorization", f"Bearer {token}".encode())])
    for _ in range(requests // 10):  # warm-up
        await call()
    started = time.process_time()
    for _ in range(requests):
        await call()
    used = time.process_time() - started
    return 1e6 * used / requests


# The parts counted one pass each (toggles do not nest): where each is reached, and its attribute there.
PARTS: dict[str, tuple[Any, str]] = {
    "dependencies_solved": (fastapi.routing, "solve_dependencies"),  # sub-dependencies and the body's model
    "endpoint": (fastapi.routing, "run_endpoint_function"),  # post_report, the batcher's answer included
    "body_strict_json": (timekeeper.routing, "loads_strict"),  # orjson, depth and repeated-key checks
    "body_model": (ModelField, "validate"),  # pydantic's validation of ReportIn
    "bearer_token": (timekeeper.auth.dependencies, "bearer_token"),  # twice: refuse_anonymous, the dependency
    "authorize": (timekeeper.usage.router, "authorize"),
    "report_checks": (timekeeper.usage.router, "check_report"),
    "pod_identity": (timekeeper.usage.router, "check_pod_identity"),
    "charge_report": (timekeeper.usage.router, "charge_report"),
}


def _collect(requests: int) -> None:
    """Run under callgrind: each pass sends `requests` reports through the ASGI app, counting one part."""

    async def passes() -> None:
        app, access, body, token = await report_app()
        call = asgi_caller(app, PATH, body, [(b"authorization", f"Bearer {token}".encode())])

        async def send(count: int, each: Callable[[], Awaitable[int]] = call) -> None:
            for _ in range(count):
                await each()

        await send(200)  # warm-up: caches filled, code paths taken once
        callgrind.start()
        await send(20)
        whole = callgrind.Calls()
        await send(requests, callgrind.counted_async(call, whole))
        callgrind.dump_part("request", whole, coroutine=True)
        await callgrind.count_nothing(requests)
        for label, (target, name) in [*PARTS.items(), ("authenticate", (access, "authenticate"))]:
            with callgrind.counting_part(target, name) as calls:
                await send(requests)
            callgrind.dump_part(label, calls, asyncio.iscoroutinefunction(getattr(target, name)))

    asyncio.run(passes())


def _client(port: int, body: bytes, token: str, requests: int) -> None:
    """A keep-alive client sending `requests` reports one after another (a process of its own)."""
    connection = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"content-type": "application/json", "authorization": f"Bearer {token}"}
    for _ in range(requests):
        connection.request("POST", PATH, body, headers)
        answer = connection.getresponse()
        answer.read()
        if answer.status != 200:
            raise SystemExit(f"status {answer.status}")


def _collect_served(requests: int) -> None:
    """Run under callgrind: uvicorn serving the bare ASGI app (make bench's baseline, its options) and the
    timekeeper's app (its own server options), each driven by a client process; a pass per count of
    requests, so what does not grow with them (the client's start) cancels out in the difference."""
    import uvicorn

    from bench.bare_asgi import app as bare
    from timekeeper.__main__ import guarded_http

    async def serve(label: str, app: Any, options: dict[str, Any], body: bytes, token: str) -> None:
        port = free_port()
        config = uvicorn.Config(
            app, port=port, log_level="warning", access_log=False, lifespan="off", **options
        )
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        for _ in range(1000):
            if server.started:
                break
            await asyncio.sleep(0.01)

        async def drive(count: int) -> None:
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.report_route", "--client", str(port), str(count), token,
                stdin=subprocess.PIPE,
            )  # fmt: skip
            await child.communicate(body)
            if child.returncode:
                raise SystemExit(f"the client failed: {child.returncode}")

        await drive(200)  # warm-up
        for count in (requests, 3 * requests):
            callgrind.toggle()
            await drive(count)
            callgrind.toggle()
            callgrind.dump(f"{label}_{count}")
        server.should_exit = True
        await task

    async def passes() -> None:
        app, _, body, token = await report_app()
        callgrind.start()
        bare_options = {"loop": "none", "http": "httptools"}
        await serve("served_bare", bare, bare_options, body, token)
        settings = Settings(database_url="postgresql+psycopg://unused@127.0.0.1/unused")
        served = {"loop": "none", "http": guarded_http(settings), "proxy_headers": True}
        await serve("served_timekeeper", app, served, body, token)

    import uvloop

    uvloop.run(passes())


def instructions(requests: int) -> dict[str, float]:
    """Instructions per report by part, in-process (`request`: the whole ASGI app; each part as counted
    in place, less what counting itself costs) and served by uvicorn over loopback (user space only: the
    kernel's share of each send is not counted)."""
    root = Path(__file__).resolve().parents[1]
    count = ["--requests", str(requests)]
    found = callgrind.run("bench.report_route", ["--under-callgrind", *count], root)
    served = callgrind.run("bench.report_route", ["--served-under-callgrind", *count], root)
    figures = {label: total / requests for label, total in callgrind.less_counting(found).items()}
    for label in ("served_bare", "served_timekeeper"):
        figures[label] = (served[f"{label}_{3 * requests}"] - served[f"{label}_{requests}"]) / (2 * requests)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--callgrind", action="store_true", help="instructions per report, by part")
    parser.add_argument("--under-callgrind", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--served-under-callgrind", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        port, count, token = args.client
        _client(int(port), sys.stdin.buffer.read(), token, int(count))
    elif args.under_callgrind:
        _collect(args.requests)
    elif args.served_under_callgrind:
        _collect_served(args.requests)
    elif args.callgrind:
        for label, count in instructions(args.requests).items():
            print(f"instructions per report, {label}: {count:,.0f}")
    else:
        print(f"ASGI stack CPU per report: {asyncio.run(cpu_per_report(args.requests)):.0f} µs")


if __name__ == "__main__":
    main()
