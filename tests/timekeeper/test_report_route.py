"""POST /reports declares its body as FastAPI does, read strictly (timekeeper.routing.StrictRoute): content
types, charsets and tokens are answered as a declared FastAPI body would be, with authentication first."""

from __future__ import annotations

from datetime import timedelta

import orjson
import pytest

from tests.support.timekeeper import Api, bearer, ok, report_body
from tests.timekeeper.conftest import START

pytestmark = pytest.mark.asyncio(loop_scope="session")

BODY = orjson.dumps(report_body(start=START - timedelta(minutes=30)))


async def test_a_json_report_with_a_charset_is_charged(api: Api) -> None:
    headers = {**bearer(api.tokens.reporter), "Content-Type": "application/json; charset=utf-8"}

    ack = ok(await api.client.post("/reports", content=BODY, headers=headers))

    assert (ack["duplicate"], ack["gpu_minutes"]) == (False, 1)
    assert (await api.budget("team-a"))["used_gpu_minutes"] == 1


async def test_a_json_report_sent_as_text_is_refused_and_charges_nothing(api: Api) -> None:
    headers = {**bearer(api.tokens.reporter), "Content-Type": "text/plain"}

    response = await api.client.post("/reports", content=BODY, headers=headers)

    assert response.status_code == 422, response.text
    assert response.json()["detail"]
    assert (await api.budget("team-a"))["used_gpu_minutes"] == 0


async def test_a_report_sent_as_another_json_type_is_refused(api: Api) -> None:
    """FastAPI would read `application/*+json` as JSON; the API takes application/json alone."""
    headers = {**bearer(api.tokens.reporter), "Content-Type": "application/merge-patch+json"}

    response = await api.client.post("/reports", content=BODY, headers=headers)

    assert (response.status_code, response.json()) == (422, {"detail": "the body must be application/json"})


async def test_an_empty_body_is_json_that_does_not_decode(api: Api) -> None:
    """FastAPI would call an empty body missing; it is refused as any body that is not JSON."""
    headers = {**bearer(api.tokens.reporter), "Content-Type": "application/json"}

    response = await api.client.post("/reports", content=b"", headers=headers)

    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert (error["type"], error["loc"]) == ("json_invalid", ["body", 0])


@pytest.mark.parametrize("authorization", [None, "Bearer nope", "Basic dXNlcjpwYXNz"])
async def test_a_well_formed_report_without_an_accepted_token_is_refused_401(
    api: Api, authorization: str | None
) -> None:
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization

    response = await api.client.post("/reports", content=BODY, headers=headers)

    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert (await api.budget("team-a"))["used_gpu_minutes"] == 0
