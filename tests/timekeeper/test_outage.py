"""A database outage: while a real PostgreSQL server of the test's own is down, reports and reads are
answered 503 with Retry-After (not 500), the outage is logged once (not per request) and shown as a
metric, and when the server is back the timekeeper serves again by itself; a restart while the pool sat
idle costs no request, and a batch lost during its COMMIT is answered 503, not written again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest
from fastapi import FastAPI
from sqlalchemy.engine import make_url

from tests.support.throwaway_postgres import ThrowawayPostgres, throwaway_postgres
from tests.support.timekeeper import Api, Tokens, bearer, migrate, ok, report_body
from timekeeper.app import create_app, current
from timekeeper.clock import ManualClock
from timekeeper.metrics import METRICS
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

NOW = datetime(2026, 3, 18, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def server() -> Iterator[ThrowawayPostgres]:
    with throwaway_postgres() as server:
        migrate(make_url(server.url))
        yield server


@pytest.fixture
async def app(server: ThrowawayPostgres, tokens: Tokens) -> AsyncIterator[FastAPI]:
    settings = Settings(database_url=server.url, scheduler_enabled=False, **tokens.settings())
    app = create_app(settings, ManualClock(NOW))
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def api(app: FastAPI, tokens: Tokens) -> AsyncIterator[Api]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://timekeeper/api/v1") as client:
        yield Api(client, tokens)


def report(n: int) -> dict[str, object]:
    return report_body(pod=f"pod-{n}", pod_uid=f"uid-{n}", start=NOW - timedelta(minutes=10))


def database_up(app: FastAPI) -> float | None:
    return current(app)[METRICS].registry.get_sample_value("timekeeper_database_up")


async def test_an_outage_is_answered_503_logged_once_and_recovered_from(
    app: FastAPI, api: Api, server: ThrowawayPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="timekeeper")
    headers = bearer(api.tokens.reporter)
    ok(await api.client.post("/reports", json=report(0), headers=headers))

    server.crash()
    try:
        answers = await asyncio.gather(
            *(api.client.post("/reports", json=report(n), headers=headers) for n in range(1, 9)),
            api.client.get("/namespaces/team-a/budget", headers=bearer(api.tokens.reader)),
        )
        again = await api.client.post("/reports", json=report(1), headers=headers)
        assert [answer.status_code for answer in [*answers, again]] == [503] * 10
        assert {answer.headers["retry-after"] for answer in answers} == {"5"}
        assert "retry later" in again.json()["detail"]
        assert database_up(app) == 0
    finally:
        server.start()

    ok(await api.client.post("/reports", json=report(9), headers=headers))
    events = [record.message for record in caplog.records]
    assert events.count("database_unavailable") == 1
    assert events.count("database_recovered") == 1
    assert database_up(app) == 1
    budget = await api.budget("team-a")
    assert budget["used_gpu_minutes"] == 2  # the reports before and after; none during the outage


async def test_a_server_restarted_while_the_pool_sat_idle_costs_no_request(
    app: FastAPI, api: Api, server: ThrowawayPostgres
) -> None:
    """The pool's connections all died with the server, and checkouts are not pinged: the reads that meet
    one run once more on a fresh connection (timekeeper.db.session.read), and the first loss replaced the
    pool's older connections, so the report and snapshot after them get fresh ones: no 503."""
    headers = bearer(api.tokens.reporter)
    ok(await api.client.post("/reports", json=report(20), headers=headers))
    # Several pooled connections, each used once (reads at once, a report).
    await asyncio.gather(*(api.budget("team-a") for _ in range(4)))

    server.restart()

    budgets = await asyncio.gather(*(api.budget("team-a") for _ in range(4)))
    ok(await api.client.post("/reports", json=report(21), headers=headers))
    snapshot = await api.client.get("/admission-state", headers=bearer(api.tokens.reader))
    assert snapshot.status_code == 200
    assert len({budget["used_gpu_minutes"] for budget in budgets}) == 1
    assert database_up(app) == 1


async def test_a_batch_runners_backend_terminated_between_batches_costs_no_report(
    app: FastAPI, api: Api, server: ThrowawayPostgres
) -> None:
    """Each batch takes a pooled connection; a batch that meets one the server closed since the last
    (here its backend terminated, as an administrator or a failover would) lost it before its COMMIT, so
    it is charged once more on a fresh connection."""
    headers = bearer(api.tokens.reporter)
    for n in range(30, 34):
        ok(await api.client.post("/reports", json=report(n), headers=headers))

    with psycopg.connect(server.url.replace("+psycopg", ""), autocommit=True) as admin:
        terminated = admin.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    assert terminated is not None and terminated[0] >= 1  # the pooled connections the batches used

    for n in range(34, 38):
        ok(await api.client.post("/reports", json=report(n), headers=headers))
    assert database_up(app) == 1


# A deferred trigger runs at COMMIT: the first ledger insert's transaction terminates its own backend there
# (a sequence counts outside transactions), as a server dying during a COMMIT would.
_DIE_AT_FIRST_COMMIT = """
CREATE SEQUENCE commits_seen;
CREATE FUNCTION die_at_first_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('commits_seen') = 1 THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
        PERFORM pg_sleep(5);
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER die_at_first_commit AFTER INSERT ON usage_ledger
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION die_at_first_commit();
"""
_LIVE_AGAIN = """
DROP TRIGGER die_at_first_commit ON usage_ledger;
DROP FUNCTION die_at_first_commit();
DROP SEQUENCE commits_seen;
"""


async def test_a_batch_whose_connection_is_lost_during_its_commit_is_answered_503(
    api: Api, server: ThrowawayPostgres
) -> None:
    """A batch whose COMMIT was sent may have landed, so it is not written again: its report is answered
    503 and the sidecar's retry is charged once. (Here it did not land; written again, it would have been
    charged and answered 200.)"""
    headers = bearer(api.tokens.reporter)
    body = report_body(
        namespace="team-commit", pod="pod-c", pod_uid="uid-commit", start=NOW - timedelta(minutes=10)
    )
    with psycopg.connect(server.url.replace("+psycopg", ""), autocommit=True) as admin:
        admin.execute(_DIE_AT_FIRST_COMMIT)
    try:
        lost = await api.client.post("/reports", json=body, headers=headers)
    finally:
        with psycopg.connect(server.url.replace("+psycopg", ""), autocommit=True) as admin:
            admin.execute(_LIVE_AGAIN)

    assert lost.status_code == 503, lost.text
    ok(await api.client.post("/reports", json=body, headers=headers))
    ok(await api.client.post("/reports", json=body, headers=headers))  # a repeat
    assert (await api.budget("team-commit"))["used_gpu_minutes"] == 1


async def test_metrics_answer_during_an_outage_with_the_last_budgets_and_their_age(
    app: FastAPI, api: Api, server: ThrowawayPostgres
) -> None:
    """The scrape is what shows an outage: it answers 200 with `timekeeper_database_up 0`, the budgets of
    the last read and how old they are, and the reports refused meanwhile counted from 0."""
    ok(await api.put_budget("team-metrics", budget_gpu_minutes=50))
    assert (await api.client.get("/metrics")).status_code == 200
    registry = current(app)[METRICS].registry

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("timekeeper_reports_total", result="rejected") is not None
    rejected_before = value("timekeeper_reports_total", result="rejected")
    server.crash()
    try:
        assert (
            await api.client.post("/reports", json=report(40), headers=bearer(api.tokens.reporter))
        ).status_code == 503
        scrape = await api.client.get("/metrics")
        during = {
            "up": value("timekeeper_database_up"),
            "budget": value("timekeeper_namespace_budget_gpu_minutes", namespace="team-metrics"),
            "age": value("timekeeper_budget_metrics_age_seconds"),
        }
    finally:
        server.start()

    assert scrape.status_code == 200, scrape.text
    assert "timekeeper_database_up 0.0" in scrape.text
    assert during["up"] == 0 and during["budget"] == 50
    assert during["age"] is not None and during["age"] > 0
    assert value("timekeeper_reports_total", result="rejected") == (rejected_before or 0) + 1
    assert (await api.client.get("/metrics")).status_code == 200
    assert value("timekeeper_database_up") == 1
    age = value("timekeeper_budget_metrics_age_seconds")
    assert age is not None and 0 <= age < during["age"]
