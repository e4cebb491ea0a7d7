"""GET /whoami answers who a credential stands for and what it may do, so the dashboard and the CLI show
only what the caller may use; it authenticates like every other read."""

from __future__ import annotations

import secrets
from dataclasses import replace

import pytest
from fastapi import FastAPI
from pydantic import AwareDatetime, TypeAdapter
from sqlalchemy.engine import URL

from tests.support.postgres import url_string
from tests.support.timekeeper import Api, Tokens, bearer, ok, sha256
from timekeeper.app import current, expose
from timekeeper.clock import ManualClock
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

TEAM_A_READER = secrets.token_urlsafe(24)  # scoped to team-a


@pytest.fixture
def settings(database_url: URL, tokens: Tokens) -> Settings:
    return Settings(
        database_url=url_string(database_url),
        scheduler_enabled=False,
        reader_tokens={sha256(TEAM_A_READER): ["team-a"]},
        **tokens.settings(),
    )


async def whoami(api: Api, token: str | None, **params: str) -> dict[str, object]:
    headers = bearer(token) if token else {}
    return ok(await api.client.get("/whoami", params=params, headers=headers))  # type: ignore[no-any-return]


async def test_an_admin_may_read_and_administer_everything(api: Api, clock: ManualClock) -> None:
    me = await whoami(api, api.tokens.admin, namespace="team-a")

    assert me["name"] == f"admin-token:{sha256(api.tokens.admin)[:12]}"
    assert (me["anonymous"], me["auth_mode"], me["may_read_all"], me["may_administer"]) == (
        False,
        "static",
        True,
        True,
    )
    assert me["namespaces"] is None
    assert me["namespace"] == {"namespace": "team-a", "may_read": True, "may_administer": True}
    assert TypeAdapter(AwareDatetime).validate_python(me["now"]) == clock.now()


async def test_a_reader_may_read_everything_and_administer_nothing(api: Api) -> None:
    me = await whoami(api, api.tokens.reader, namespace="team-a")

    assert (me["may_read_all"], me["may_administer"]) == (True, False)
    assert me["namespace"] == {"namespace": "team-a", "may_read": True, "may_administer": False}


async def test_a_scoped_reader_learns_its_namespaces(api: Api) -> None:
    own = await whoami(api, TEAM_A_READER, namespace="team-a")
    other = await whoami(api, TEAM_A_READER, namespace="team-b")

    assert (own["may_read_all"], own["may_administer"], own["namespaces"]) == (False, False, ["team-a"])
    assert own["namespace"] == {"namespace": "team-a", "may_read": True, "may_administer": False}
    assert other["namespace"] == {"namespace": "team-b", "may_read": False, "may_administer": False}


async def test_without_a_namespace_no_namespace_is_answered(api: Api) -> None:
    assert (await whoami(api, api.tokens.reader))["namespace"] is None


@pytest.mark.parametrize("token", [None, "not-a-token"])
async def test_an_unauthenticated_caller_is_refused(api: Api, token: str | None) -> None:
    response = await api.client.get("/whoami", headers=bearer(token) if token else {})

    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"


async def test_anonymous_may_ask_when_anonymous_reads_are_on(api: Api, app: FastAPI) -> None:
    context = current(app)
    expose(app, replace(context, settings=context.settings.model_copy(update={"anonymous_read": True})))

    me = await whoami(api, None, namespace="team-a")

    assert (me["name"], me["anonymous"], me["may_read_all"], me["may_administer"]) == (
        "anonymous",
        True,
        True,
        False,
    )
    assert me["namespace"] == {"namespace": "team-a", "may_read": True, "may_administer": False}


@pytest.mark.parametrize("namespace", ["Team_A", "-a", "a" * 64, ""])
async def test_a_namespace_that_is_no_namespace_name_is_422(api: Api, namespace: str) -> None:
    response = await api.client.get(
        "/whoami", params={"namespace": namespace}, headers=bearer(api.tokens.reader)
    )

    assert response.status_code == 422, response.text
