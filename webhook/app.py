"""The ASGI app: `/mutate`, `/validate`, `/healthz`, `/metrics`; the state poller and the PriorityClass
watch run in its lifespan.

An admission endpoint reads the body within `max_body_bytes`, parses the review once, lets the decision
return a typed answer, encodes it, and counts and logs it (a dryRun request leaves no trace but latency).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from webhook.admission import Admission
from webhook.certificates import CertificateReloader
from webhook.metrics import WebhookMetrics
from webhook.priorityclasses import PriorityClassCatalog, priority_class_watch
from webhook.review import (
    AdmissionRequest,
    AdmissionResponse,
    MalformedReview,
    WebhookError,
    build_response,
    parse_review,
)
from webhook.settings import WebhookSettings, get_settings
from webhook.state import BudgetStateCache, StatePoller

JSON = "application/json"

log = logging.getLogger("webhook.admission")


class BodyTooLarge(WebhookError):
    status_code = 413


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or BodyTooLarge as soon as it is known to exceed `limit`: by Content-Length before a byte
    is read, else counted as it streams (a chunked body), so an oversized body is never held whole."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and (len(declared) > len(str(limit)) or int(declared) > limit):
        raise BodyTooLarge(f"the body ({declared} bytes) is over the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _refusal(error: WebhookError, **headers: str) -> Response:
    return Response(
        orjson.dumps({"detail": error.message}),
        status_code=error.status_code,
        media_type=JSON,
        headers=headers,
    )


def _log_denial(endpoint: str, request: AdmissionRequest, answer: AdmissionResponse) -> None:
    metadata = (request.object or {}).get("metadata") or {}
    log.info(
        "admission_denied",
        extra={
            "endpoint": endpoint,
            "namespace": request.namespace or metadata.get("namespace", ""),
            "pod": request.name or metadata.get("name") or metadata.get("generateName", ""),
            "operation": request.operation,
            "rules": list(answer.denial.rules) if answer.denial else [],
        },
    )


def _endpoint(
    name: str,
    decide: Callable[[AdmissionRequest], AdmissionResponse],
    metrics: WebhookMetrics,
    settings: WebhookSettings,
) -> Callable[[Request], Any]:
    admissions = metrics.admissions
    latency = metrics.latency.labels(endpoint=name)
    malformed = metrics.malformed.labels(endpoint=name)
    too_large = metrics.refused.labels(reason="body_too_large")

    async def handle(request: Request) -> Response:
        try:
            body = await read_body(request, settings.max_body_bytes)
        except BodyTooLarge as error:
            too_large.inc()
            # The rest of the body may still be on its way: close rather than read it to reuse the connection.
            return _refusal(error, Connection="close")
        except ClientDisconnect:  # closed mid-body (e.g. by the request timeout): no one to answer
            return Response(status_code=400)
        started = time.perf_counter()
        try:
            review = parse_review(body, settings.max_containers)
        except MalformedReview as error:
            malformed.inc()
            return _refusal(error)
        answer = decide(review.request)
        encoded = build_response(review, answer)
        latency.observe(time.perf_counter() - started)
        if not review.request.dry_run:
            admissions.labels(endpoint=name, operation=review.request.operation, result=answer.result).inc()
            if answer.denial is not None:
                _log_denial(name, review.request, answer)
        return Response(encoded, media_type=JSON)

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
            Route("/mutate", _endpoint("mutate", admission.mutate, metrics, settings), methods=["POST"]),
            Route(
                "/validate", _endpoint("validate", admission.validate, metrics, settings), methods=["POST"]
            ),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.admission = admission
    app.state.cache = cache
    app.state.metrics = metrics
    return app
