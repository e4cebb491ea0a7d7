"""A namespace's state history (budget_events, written by a trigger whichever path changes a state) is
listed to that namespace's readers, newest first, paged."""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.engine import URL

from tests.support.postgres import url_string
from tests.support.timekeeper import Api, Tokens, bearer, ok, sha256
from timekeeper.clock import ManualClock
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

TEAM_A_READER = secrets.token_urlsafe(24)


@pytest.fixture
def settings(database_url: URL, tokens: Tokens) -> Settings:
    return Settings(
        database_url=url_string(database_url),
        scheduler_enabled=False,
        reader_tokens={sha256(TEAM_A_READER): ["team-a"]},
        **tokens.settings(),
    )


async def events(api: Api, namespace: str, token: str = TEAM_A_READER, **params: Any) -> list[dict[str, Any]]:
    response = await api.client.get(
        f"/namespaces/{namespace}/budget/events", params=params, headers=bearer(token)
    )
    return list(ok(response))


async def test_every_transition_is_listed_newest_first(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=10, warn_at_fraction=0.5))
    start = clock.now() - timedelta(minutes=12)
    ok(await api.report(seq=1, start=start, minutes=6))  # warning
    ok(await api.report(seq=2, start=start + timedelta(minutes=6), minutes=6))  # exhausted
    ok(await api.grant("team-a", 100))  # in budget again

    listed = await events(api, "team-a")

    assert [(e["old_state"], e["new_state"]) for e in listed] == [
        ("exhausted", "in_budget"),
        ("warning", "exhausted"),
        ("in_budget", "warning"),
        (None, "in_budget"),
    ]
    assert [e["id"] for e in listed] == sorted((e["id"] for e in listed), reverse=True)


async def test_events_are_paged_with_before_id(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=1))
    ok(await api.report(seq=1, start=clock.now() - timedelta(minutes=2), minutes=2))
    newest, first = await events(api, "team-a")

    page = await events(api, "team-a", limit=1, before_id=newest["id"])

    assert page == [first]
    assert await events(api, "team-a", limit=1) == [newest]


async def test_only_the_namespaces_readers_see_its_events(api: Api, clock: ManualClock) -> None:
    for namespace in ("team-a", "team-b"):
        ok(await api.put_budget(namespace, budget_gpu_minutes=1))

    other = await api.client.get("/namespaces/team-b/budget/events", headers=bearer(TEAM_A_READER))
    anonymous = await api.client.get("/namespaces/team-a/budget/events")

    assert (other.status_code, anonymous.status_code) == (403, 401)
    assert [e["new_state"] for e in await events(api, "team-b", token=api.tokens.reader)] == ["in_budget"]
    assert await events(api, "team-c", token=api.tokens.reader) == []
