"""Static reporter tokens scoped to namespaces report only there (issue #27: an unscoped reporter token
charged another team's namespace with a made-up pod and exhausted its budget)."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

import pytest
from sqlalchemy.engine import URL

from tests.support.postgres import url_string
from tests.support.timekeeper import Api, Tokens, bearer, ok, sha256
from timekeeper.clock import ManualClock
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

TEAM_A_REPORTER = secrets.token_urlsafe(24)  # scoped to team-a
START = datetime(2026, 3, 2, tzinfo=UTC)


@pytest.fixture
def settings(database_url: URL, tokens: Tokens) -> Settings:
    return Settings(
        database_url=url_string(database_url),
        scheduler_enabled=False,
        reporter_tokens={sha256(TEAM_A_REPORTER): ["team-a"]},
        **tokens.settings(),
    )


async def test_a_scoped_reporter_is_refused_for_another_namespace(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-b", budget_gpu_minutes=100))
    clock.set(START.replace(hour=1))

    own = await api.report(TEAM_A_REPORTER, namespace="team-a", start=START, gpu_share=1)
    other = await api.report(TEAM_A_REPORTER, namespace="team-b", start=START, pod="x", gpu_share=256)

    assert own.status_code == 200
    assert other.status_code == 403
    assert (await api.budget("team-b"))["used_gpu_minutes"] == 0


async def test_a_scoped_reporter_reads_only_its_namespaces(api: Api) -> None:
    ok(await api.put_budget("team-b", budget_gpu_minutes=100))
    scoped = bearer(TEAM_A_REPORTER)

    listed = ok(await api.client.get("/namespaces", headers=scoped))
    other = await api.client.get("/namespaces/team-b/budget", headers=scoped)

    assert {entry["namespace"] for entry in listed} <= {"team-a"}
    assert other.status_code == 403
