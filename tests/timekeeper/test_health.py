"""Probes, the Prometheus scrape and the OpenAPI document."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from tests.support.timekeeper import Api, bearer, ok, report_body
from tests.timekeeper.conftest import START
from timekeeper.app import create_app, current, expose, run_context
from timekeeper.clock import ManualClock
from timekeeper.db.session import build_engine, build_sessionmaker
from timekeeper.metrics import METRICS
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def root_client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://timekeeper")


async def test_probes_answer_at_the_root_and_under_the_api(app: FastAPI) -> None:
    async with root_client(app) as client:
        for path in ("/healthz", "/readyz", "/api/v1/healthz", "/api/v1/readyz"):
            assert (await client.get(path)).status_code == 200


async def test_readyz_answers_503_when_the_database_is_unreachable(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    unreachable = build_engine("postgresql+psycopg://nobody@127.0.0.1:1/none", pool_size=1)
    sessions = build_sessionmaker(unreachable)
    expose(app, replace(current(app), sessions=sessions, reads=sessions))
    try:
        response = await client.get("/readyz")
    finally:
        await unreachable.dispose()

    assert response.status_code == 503
    assert "database unreachable" in response.json()["detail"]


async def test_metrics_count_reports_by_result_and_show_each_namespace(api: Api) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=10))
    start = START - timedelta(minutes=30)
    ok(await api.report(seq=1, start=start, minutes=4))
    ok(await api.report(seq=1, start=start, minutes=4))
    assert (await api.report(seq=2, start=start, end=start)).status_code == 422

    scraped = samples((await api.client.get("/metrics")).text)

    assert scraped[("timekeeper_reports_total", (("result", "charged"),))] == 1
    assert scraped[("timekeeper_reports_total", (("result", "duplicate"),))] == 1
    assert scraped[("timekeeper_reports_total", (("result", "rejected"),))] == 1
    assert scraped[("timekeeper_report_ingest_seconds_count", ())] == 2
    assert scraped[("timekeeper_namespace_budget_gpu_minutes", (("namespace", "team-a"),))] == 10
    assert scraped[("timekeeper_namespace_used_gpu_minutes", (("namespace", "team-a"),))] == 4
    assert scraped[("timekeeper_namespace_remaining_gpu_minutes", (("namespace", "team-a"),))] == 6
    assert scraped[("timekeeper_namespace_state", (("namespace", "team-a"), ("state", "in_budget")))] == 1
    assert scraped[("timekeeper_namespace_state", (("namespace", "team-a"), ("state", "exhausted")))] == 0


async def test_metrics_count_reports_refused_before_their_body_or_by_authorization(api: Api) -> None:
    """Rejected counts a report whatever refused it: no credential (refused before FastAPI reads the
    body), a token not accepted, a caller that may not report; none of them is timed."""
    body = report_body(start=START - timedelta(minutes=30))

    anonymous = await api.client.post("/reports", json=body)
    unknown = await api.client.post("/reports", json=body, headers=bearer("not-a-token"))
    reader = await api.client.post("/reports", json=body, headers=bearer(api.tokens.reader))

    assert (anonymous.status_code, unknown.status_code, reader.status_code) == (401, 401, 403)
    scraped = samples((await api.client.get("/metrics")).text)
    assert scraped[("timekeeper_reports_total", (("result", "rejected"),))] == 3
    assert scraped[("timekeeper_report_ingest_seconds_count", ())] == 0


async def test_two_apps_keep_separate_metrics(app: FastAPI, settings: Settings, clock: ManualClock) -> None:
    other = create_app(settings)

    async with run_context(other, settings, clock) as theirs:
        assert theirs[METRICS].registry is not current(app)[METRICS].registry


async def test_the_openapi_document_lists_the_v1_contract(app: FastAPI) -> None:
    async with root_client(app) as client:
        paths = (await client.get("/openapi.json")).json()["paths"]
        docs = await client.get("/docs", follow_redirects=True)
        assert docs.status_code == 200 and "swagger" in docs.text.lower()

    for path in (
        "/api/v1/reports",
        "/api/v1/namespaces",
        "/api/v1/namespaces/{namespace}/budget",
        "/api/v1/namespaces/{namespace}/grants",
        "/api/v1/namespaces/{namespace}/usage",
        "/api/v1/defaults",
        "/api/v1/audit",
        "/api/v1/admission-state",
    ):
        assert path in paths


async def test_every_counters_known_label_sets_start_at_zero(app: FastAPI) -> None:
    """A series born at its first event has no earlier sample: rate() would miss the first burst."""
    async with root_client(app) as client:
        scraped = samples((await client.get("/metrics")).text)

    for result in ("charged", "duplicate", "rejected"):
        assert scraped[("timekeeper_reports_total", (("result", result),))] == 0
    for reason in ("outage", "refused"):
        assert scraped[("timekeeper_ingest_batch_failures_total", (("reason", reason),))] == 0
    assert scraped[("timekeeper_budget_metrics_age_seconds", ())] >= 0
