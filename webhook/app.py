"""The ASGI app: `/mutate`, `/validate`, `/healthz`, `/metrics`; the state poller and the PriorityClass
watch run in its lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from webhook.admission import Admission
from webhook.certificates import CertificateReloader
from webhook.metrics import WebhookMetrics
from webhook.priorityclasses import PriorityClassCatalog, priority_class_watch
from webhook.review import AdmissionRequest, MalformedReview, parse_review
from webhook.settings import WebhookSettings, get_settings
from webhook.state import BudgetStateCache, StatePoller

JSON = "application/json"


def _endpoint(
    name: str, decide: Callable[[AdmissionRequest], tuple[bytes, str]], metrics: WebhookMetrics
) -> Callable[[Request], Any]:
    admissions = metrics.admissions
    latency = metrics.latency.labels(endpoint=name)
    malformed = metrics.malformed.labels(endpoint=name)

    async def handle(request: Request) -> Response:
        body = await request.body()
        started = time.perf_counter()
        try:
            review = parse_review(body)
        except MalformedReview as error:
            malformed.inc()
            return Response(
                orjson.dumps({"detail": error.message}), status_code=error.status_code, media_type=JSON
            )
        answer, result = decide(review)
        latency.observe(time.perf_counter() - started)
        admissions.labels(endpoint=name, operation=review.operation, result=result).inc()
        return Response(answer, media_type=JSON)

    return handle


def create_app(settings: WebhookSettings | None = None) -> Starlette:
    """Build the app; the cache, metrics and admission logic are per app, the poller starts in lifespan.

    When the server sets `app.state.ssl_context` (python -m webhook does), the lifespan also reloads the
    serving certificate into it whenever the files change.
    """
    settings = settings or get_settings()
    cache = BudgetStateCache(settings.state_max_age_seconds)
    metrics = WebhookMetrics(cache.age_seconds)
    priority_classes = PriorityClassCatalog()
    metrics.priority_classes.set_function(priority_classes.known)
    admission = Admission(settings, cache, metrics, priority_classes)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with (
            httpx.AsyncClient() as client,
            priority_class_watch(settings, priority_classes, metrics),
        ):
            poller = StatePoller(settings, cache, metrics, client)
            tasks = [asyncio.create_task(poller.run(), name="admission-state-poller")]
            context = getattr(app.state, "ssl_context", None)
            if context is not None and settings.tls_cert_file and settings.tls_key_file:
                reloader = CertificateReloader(context, settings.tls_cert_file, settings.tls_key_file)
                tasks.append(asyncio.create_task(reloader.run(settings.tls_reload_interval_seconds)))
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def healthz(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type=JSON)

    async def metrics_endpoint(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app = Starlette(
        routes=[
            Route("/mutate", _endpoint("mutate", admission.mutate, metrics), methods=["POST"]),
            Route("/validate", _endpoint("validate", admission.validate, metrics), methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.admission = admission
    app.state.cache = cache
    app.state.metrics = metrics
    return app
