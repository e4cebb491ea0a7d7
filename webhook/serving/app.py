"""The ASGI app: `/mutate`, `/validate`, `/healthz`, `/metrics`, the budget state poller and the watches
in its lifespan. An admission is read within `httpguard.bodies.BodyLimit`, parsed once, decided,
encoded, then counted and logged (a dryRun leaves no trace but latency)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import get_args

import httpx
import orjson
from kubernetes_asyncio import client
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gpuaccounting.counters import start_at_zero
from httpguard.bodies import BodyLimit, BodyTooLarge
from webhook.certificates.reloader import CertificateReloader
from webhook.decisions.admission import Admission
from webhook.decisions.answer import AdmissionResponse, Result, build_response
from webhook.decisions.priority import DecisionRecorder
from webhook.metrics import WebhookMetrics
from webhook.reviews.review import AdmissionRequest, MalformedReview, WebhookError, parse_review
from webhook.settings import WebhookSettings, get_settings
from webhook.watches.budgetcache import BudgetStateCache, BudgetStatePoller
from webhook.watches.dra import DraObjects, DraWatch
from webhook.watches.kubewatch import api_client
from webhook.watches.priorityclasses import PriorityClassCatalog, priority_class_watch
from webhook.watches.workloads import workload_pod_watch

JSON = b"application/json"

log = logging.getLogger("webhook.admission")
# The operations the webhook configurations send (deployment/base/webhook): their counts start at 0.
ADMITTED_OPERATIONS = ("CREATE", "UPDATE")


async def read_body(receive: Receive) -> bytes | None:
    """The whole body (its size bounded by `BodyLimit` around the app); None when the client left first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(refusal: BodyTooLarge) -> bytes:
    size = "" if refusal.declared is None else f" ({refusal.declared} bytes)"
    return orjson.dumps({"detail": f"the body{size} is over the limit of {refusal.limit} bytes"})


async def _answer(send: Send, status: int, body: bytes, *extra: tuple[bytes, bytes]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", JSON), (b"content-length", b"%d" % len(body)), *extra],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _refusal_body(error: WebhookError) -> bytes:
    return orjson.dumps({"detail": error.message})


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


class AdmissionEndpoint:
    """One admission endpoint as a plain ASGI app (Starlette routes to it; no Request or Response object
    is built per admission): read the body, parse the review once, let the
    decision return a typed answer, encode it, then count it, its priority decision and a denial's log
    line, unless the review is a dryRun (which leaves no trace but latency)."""

    def __init__(
        self,
        name: str,
        decide: Callable[[AdmissionRequest], AdmissionResponse],
        metrics: WebhookMetrics,
        decisions: DecisionRecorder,
        settings: WebhookSettings,
        prepare: Callable[[AdmissionRequest], Awaitable[None]],
    ) -> None:
        self.name = name
        self.decide = decide
        self.prepare = prepare
        self.decisions = decisions
        self.max_containers = settings.max_containers
        self.admissions = metrics.admissions
        self.latency = metrics.latency.labels(endpoint=name)
        self.malformed = metrics.malformed.labels(endpoint=name)
        # The admissions counter's children by (operation, result), bound on first use: `labels()`
        # costs more than the increment.
        self._counted: dict[tuple[str, str], Counter] = {}
        start_at_zero(
            self.admissions, endpoint=(name,), operation=ADMITTED_OPERATIONS, result=get_args(Result)
        )

    def count(self, request: AdmissionRequest, answer: AdmissionResponse) -> None:
        """Count a real (not dryRun) admission: by result, its priority decision by rule, a denial's log."""
        key = (request.operation, answer.result)
        counter = self._counted.get(key)
        if counter is None:
            counter = self._counted[key] = self.admissions.labels(
                endpoint=self.name, operation=key[0], result=key[1]
            )
        counter.inc()
        if answer.priority is not None:
            self.decisions.record(answer.priority)
        if answer.denial is not None:
            _log_denial(self.name, request, answer)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        if body is None:  # closed mid-body (e.g. by the body deadline): no one to answer
            await _answer(send, 400, b"")
            return
        started = time.perf_counter()
        try:
            review = parse_review(body, self.max_containers)
        except MalformedReview as error:
            self.malformed.inc()
            await _answer(send, error.status_code, _refusal_body(error))
            return
        await self.prepare(review.request)
        answer = self.decide(review.request)
        encoded = build_response(review, answer)
        self.latency.observe(time.perf_counter() - started)
        if not review.request.dry_run:
            self.count(review.request, answer)
        await _answer(send, 200, encoded)


@contextlib.asynccontextmanager
async def kube_client(settings: WebhookSettings) -> AsyncIterator[client.ApiClient | None]:
    """The Kubernetes API client the watches share; None when every watch is off."""
    if not (
        settings.watch_priority_classes or settings.watches_resource_claims or settings.watches_workload_pods
    ):
        yield None
        return
    async with await api_client(settings) as kube:
        yield kube


def create_app(settings: WebhookSettings | None = None) -> Starlette:
    """Build the app; the cache, metrics and admission logic are per app, the poller starts in lifespan,
    which also reloads a changed certificate into `app.state.ssl_context` when the server set one."""
    settings = settings or get_settings()
    cache = BudgetStateCache(settings.state_max_age_seconds)
    metrics = WebhookMetrics(cache.age_seconds)
    priority_classes = PriorityClassCatalog()
    metrics.priority_classes.set_function(priority_classes.known)
    admission = Admission(settings, cache, priority_classes, DraObjects())
    metrics.workload_pods.set_function(admission.workloads.known)
    decisions = DecisionRecorder(metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with httpx.AsyncClient() as http, kube_client(settings) as kube:
            poller = BudgetStatePoller(settings, cache, metrics, http)
            tasks = [asyncio.create_task(poller.run(), name="admission-state-poller")]
            if kube is not None and settings.watch_priority_classes:
                watch = priority_class_watch(
                    client.SchedulingV1Api(kube), priority_classes, metrics, settings
                )
                tasks.append(asyncio.create_task(watch.run(), name="priority-class-watch"))
            if kube is not None and settings.watches_workload_pods:
                pods = workload_pod_watch(kube, admission.workloads, metrics, settings)
                tasks.append(asyncio.create_task(pods.run(), name="workload-pod-watch"))
            if kube is not None and settings.watches_resource_claims:
                admission.dra_watch = DraWatch(kube, admission.dra, metrics, settings)
                tasks.append(asyncio.create_task(admission.dra_watch.run(), name="dra-watch"))
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
        return Response(b'{"status":"ok"}', media_type="application/json")

    async def metrics_endpoint(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def endpoint(name: str, decide: Callable[[AdmissionRequest], AdmissionResponse]) -> Route:
        admitting = AdmissionEndpoint(name, decide, metrics, decisions, settings, admission.prepare)
        return Route(f"/{name}", admitting, methods=["POST"])

    too_large = metrics.refused.labels(reason="body_too_large")
    # The 413 closes the connection: the rest of an oversized body is not worth a connection kept open.
    body_limit = Middleware(
        BodyLimit, max_bytes=settings.max_body_bytes, render=_too_large, close=True, on_refused=too_large.inc
    )
    app = Starlette(
        routes=[
            endpoint("mutate", admission.mutate),
            endpoint("validate", admission.validate),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
        ],
        middleware=[body_limit],
        lifespan=lifespan,
    )
    app.state.admission = admission
    app.state.cache = cache
    app.state.metrics = metrics
    return app
