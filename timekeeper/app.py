"""The application factory. Everything with I/O (engine, embedded database, access control) is built in
the lifespan; the factory itself only wires objects together."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from inspect import isawaitable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuaccounting.names import API_PREFIX, REPORTS_PATH
from timekeeper.admission.router import router as admission_router
from timekeeper.admission.service import SnapshotCache
from timekeeper.audit.router import router as audit_router
from timekeeper.auth.digests import TokenDigests
from timekeeper.auth.factory import build_access_control
from timekeeper.auth.router import router as auth_router
from timekeeper.billing.router import namespaced as billing_namespaced_router
from timekeeper.billing.router import router as billing_router
from timekeeper.budgets.router import get_budget
from timekeeper.budgets.router import router as budgets_router
from timekeeper.clock import Clock
from timekeeper.db.session import (
    ReadConnections,
    build_engine,
    build_read_sessionmaker,
    build_sessionmaker,
    resolve_database_url,
)
from timekeeper.errors import install_error_handler
from timekeeper.health.router import router as health_router
from timekeeper.metrics import Metrics
from timekeeper.pools.router import router as pools_router
from timekeeper.scheduler.runner import with_scheduler
from timekeeper.schemas import API_ERRORS
from timekeeper.settings import Settings, get_settings
from timekeeper.ui import mount_docs, mount_ui
from timekeeper.usage.batcher import IngestBatcher
from timekeeper.usage.router import REPORT_SCHEMAS, add_report_route, post_report
from timekeeper.usage.router import router as usage_router


def limited_body(scope: Scope, receive: Receive, max_bytes: int) -> tuple[Response | None, Receive]:
    """A body above the limit refused with 413: by Content-Length before reading (the answer, to send
    instead), or while streaming (chunked uploads), by failing the read with an HTTPException (the
    receive to read through), which the app's handler answers."""
    too_large = HTTPException(413, f"request body larger than {max_bytes} bytes")
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > max_bytes:
            return JSONResponse({"detail": too_large.detail}, status_code=413), receive
    received = 0

    async def limited() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > max_bytes:
                raise too_large
        return message

    return None, limited


class BodySizeLimit:
    """Refuses bodies above the limit with 413 (limited_body)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused, limited = limited_body(scope, receive, self.max_bytes)
        if refused is not None:
            await refused(scope, receive, send)
            return
        await self.app(scope, limited, send)


_BUDGET_PREFIX, _BUDGET_SUFFIX = f"{API_PREFIX}/namespaces/", "/budget"


def _budget_namespace(path: str) -> str | None:
    """The `{namespace}` of GET /namespaces/{namespace}/budget, when the path is that route's."""
    if not (path.startswith(_BUDGET_PREFIX) and path.endswith(_BUDGET_SUFFIX)):
        return None
    namespace = path[len(_BUDGET_PREFIX) : -len(_BUDGET_SUFFIX)]
    return namespace if namespace and "/" not in namespace else None


class TimekeeperApp(FastAPI):
    """FastAPI, with `POST /reports` (the hottest path by far: every GPU pod, every interval) answered
    before Starlette's middleware and router: the endpoint takes the Request alone and answers a
    Response itself, its refusals are answered by the app's own exception handlers and its body is
    limited as every other's, so the layers between (two exception middlewares, FastAPI's telemetry
    and exit-stack middlewares, the router's matching, the route's wrapper) did nothing for it but
    cost CPU, on the way in and again on every resumption while the report waits for its batch's
    commit (docs/performance.md, "Ingest"). `GET /namespaces/{ns}/budget` is answered the same way
    (docs/performance.md, "Reads"). Everything else, and any other method on those paths, takes the
    usual way; the routes stay declared, so the OpenAPI documents them as before."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if scope["path"] == REPORTS_PATH and scope["method"] == "POST":
                await self._direct(post_report, scope, receive, send)
                return
            # The budget read likewise (what dashboards and the CLI poll): the same endpoint, handed the
            # path parameter Starlette's router would have matched (`{namespace}`: one non-empty segment).
            namespace = _budget_namespace(scope["path"])
            if namespace is not None and scope["method"] == "GET":
                scope["path_params"] = {"namespace": namespace}
                await self._direct(get_budget, scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def _direct(
        self, endpoint: Callable[[Request], Awaitable[Response]], scope: Scope, receive: Receive, send: Send
    ) -> None:
        scope["app"] = self
        refused, limited = limited_body(scope, receive, self.state.settings.max_body_bytes)
        if refused is not None:
            await refused(scope, receive, send)
            return
        request = Request(scope, limited)
        try:
            try:
                response = await endpoint(request)
            except Exception as error:
                handler = next(
                    (
                        self.exception_handlers[kind]
                        for kind in type(error).__mro__
                        if kind in self.exception_handlers
                    ),
                    None,
                )
                if handler is None:
                    raise
                answer = handler(request, error)
                response = await answer if isawaitable(answer) else answer
        except Exception:
            # As Starlette's ServerErrorMiddleware: a plain 500, and the error raised on to the server,
            # which logs it with its traceback.
            await PlainTextResponse("Internal Server Error", status_code=500)(scope, receive, send)
            raise
        await response(scope, receive, send)


def default_clock(settings: Settings) -> Clock:
    return settings.clock()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    engine = build_engine(await resolve_database_url(settings), settings.database_pool_size)
    app.state.engine = engine
    app.state.sessionmaker = build_sessionmaker(engine)
    app.state.read_sessionmaker = build_read_sessionmaker(engine)
    app.state.reads = ReadConnections()
    app.state.snapshot_cache = SnapshotCache()
    app.state.chargeback_turns = asyncio.Semaphore(settings.chargeback_exports)
    app.state.access = await build_access_control(settings)
    app.state.pod_shares = None
    if settings.admitted_share_from_pod:  # the Kubernetes client only where it is used
        from timekeeper.usage.admitted import build_pod_shares

        app.state.pod_shares = await build_pod_shares(settings)
    app.state.metrics.outages.attach(engine)
    app.state.ingest = IngestBatcher(
        lambda: app.state.sessionmaker, settings, app.state.clock, app.state.metrics
    )
    app.state.ingest.start()
    try:
        yield
    finally:
        await app.state.ingest.aclose()
        await app.state.reads.release()
        await app.state.access.aclose()
        if app.state.pod_shares is not None:
            await app.state.pod_shares.aclose()
        await engine.dispose()


def create_app(settings: Settings | None = None, clock: Clock | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = TimekeeperApp(
        title="GPU Timekeeper",
        version="1",
        summary="Per-namespace GPU-minute budgets, the usage ledger and the admission snapshot.",
        lifespan=with_scheduler(lifespan),
        # Its OpenTelemetry hooks would ask the environment for a tracer on every request; the
        # timekeeper's metrics are Prometheus' (timekeeper/metrics.py).
        telemetry={"tracing": False, "metrics": False, "logs": False},
        # /docs is mount_docs' page on files in the image; FastAPI's pages load scripts from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.clock = clock or default_clock(settings)
    app.state.metrics = Metrics()
    app.state.metrics_tokens = TokenDigests(settings.metrics_token_sha256)
    install_error_handler(app)
    add_report_route(app)
    api = APIRouter(prefix=API_PREFIX)
    for router in (
        usage_router,
        budgets_router,
        pools_router,
        audit_router,
        admission_router,
        billing_router,
        billing_namespaced_router,
        auth_router,
    ):
        api.include_router(router, responses=API_ERRORS)
    api.include_router(health_router)
    app.include_router(api)
    # Probes and scrapers expect these at the root as well.
    app.include_router(health_router, include_in_schema=False)
    mount_docs(app)
    if settings.ui_enabled:
        mount_ui(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    _document_schemas(app, REPORT_SCHEMAS)
    return app


def _document_schemas(app: FastAPI, schemas: dict[str, Any]) -> None:
    """Adds to the OpenAPI components the schemas of bodies an endpoint reads itself (POST /reports)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            build().setdefault("components", {}).setdefault("schemas", {}).update(schemas)
        return build()

    app.openapi = openapi  # type: ignore[method-assign]
