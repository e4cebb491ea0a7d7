"""Reads are scoped in every mode: static reader tokens scoped to namespaces read only those, and
`/metrics` (every namespace's figures) can require a token. (How such tokens are configured is checked in
tests/timekeeper/test_settings.py: this module's tests all run on the session loop.)"""

from __future__ import annotations

import secrets

import pytest
from sqlalchemy.engine import URL

from tests.support.postgres import url_string
from tests.support.timekeeper import Api, Tokens, bearer, ok, sha256
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

TEAM_A_READER = secrets.token_urlsafe(24)  # scoped to team-a and team-c
METRICS = secrets.token_urlsafe(24)


@pytest.fixture
def settings(database_url: URL, tokens: Tokens) -> Settings:
    return Settings(
        database_url=url_string(database_url),
        scheduler_enabled=False,
        reader_tokens={sha256(TEAM_A_READER): ["team-c", "team-a"]},
        metrics_auth="token",
        metrics_token_sha256=sha256(METRICS),
        **tokens.settings(),
    )


async def test_a_scoped_reader_reads_its_namespaces_and_nothing_else(api: Api) -> None:
    for namespace in ("team-a", "team-b"):
        ok(await api.put_budget(namespace, budget_gpu_minutes=10))
    scoped = bearer(TEAM_A_READER)

    own = await api.client.get("/namespaces/team-a/budget", headers=scoped)
    own_usage = await api.client.get("/namespaces/team-a/usage", headers=scoped)
    other = await api.client.get("/namespaces/team-b/budget", headers=scoped)
    other_usage = await api.client.get("/namespaces/team-b/usage", headers=scoped)
    snapshot = await api.client.get("/admission-state", headers=scoped)

    assert (own.status_code, own_usage.status_code) == (200, 200)
    assert ok(own)["budget_gpu_minutes"] == 10
    assert (other.status_code, other_usage.status_code, snapshot.status_code) == (403, 403, 403)


async def test_a_scoped_reader_lists_exactly_its_namespaces(api: Api) -> None:
    for namespace in ("team-a", "team-b"):
        ok(await api.put_budget(namespace, budget_gpu_minutes=10))

    scoped = ok(await api.client.get("/namespaces", headers=bearer(TEAM_A_READER)))
    unscoped = ok(await api.client.get("/namespaces", headers=bearer(api.tokens.reader)))

    assert [entry["namespace"] for entry in scoped] == ["team-a", "team-c"]
    assert [entry["namespace"] for entry in unscoped] == ["team-a", "team-b"]


async def test_a_scoped_reader_may_not_write(api: Api) -> None:
    response = await api.put_budget("team-a", token=TEAM_A_READER)

    assert response.status_code == 403
    assert ok(await api.get("/audit")) == []


@pytest.mark.parametrize("path", ["/metrics", "/api/v1/metrics"])
async def test_metrics_need_a_metrics_token_or_a_cluster_wide_reader(api: Api, path: str) -> None:
    async def scrape(token: str | None) -> int:
        headers = {} if token is None else bearer(token)
        return (await api.client.get(f"http://timekeeper{path}", headers=headers)).status_code

    assert await scrape(None) == 401
    assert await scrape("not-a-token") == 401
    assert await scrape(TEAM_A_READER) == 403  # the scrape shows every namespace
    for token in (METRICS, api.tokens.reader, api.tokens.admin):
        assert await scrape(token) == 200


async def test_a_metrics_token_reads_nothing_but_the_metrics(api: Api) -> None:
    response = await api.client.get("/namespaces/team-a/budget", headers=bearer(METRICS))

    assert response.status_code == 401
