"""The API's edges an outside probe found loose (issue #20): who is told what, and what the document says.

Writes authenticate before they validate, so an anonymous client learns nothing about a body's shape;
OPTIONS and 405 name every method a path has; /readyz tells an anonymous prober only whether the replica
is ready; the OpenAPI document says which strings an amount accepts, and names the cluster header and the
`cluster` beside every answer's bare namespace (docs/fleet.md).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from gpuaccounting.names import API_PREFIX, CLUSTER_HEADER
from tests.support.timekeeper import Tokens, bearer
from timekeeper.app import current, expose
from timekeeper.clock import ManualClock
from timekeeper.periodic.runner import PeriodicRunner, replica_name
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

WRITES = [
    ("PUT", "/namespaces/team-a/budget"),
    ("DELETE", "/namespaces/team-a/budget"),
    ("PUT", "/defaults"),
    ("POST", "/namespaces/team-a/grants"),
    ("DELETE", "/namespaces/team-a/grants/1"),
]
BAD_BODIES = [b"{", b'{"budget_gpu_minutes": "lots", "gpu_minutes": []}', b"[]"]


@pytest.mark.parametrize(("method", "path"), WRITES)
@pytest.mark.parametrize("body", BAD_BODIES)
async def test_a_write_without_a_valid_token_is_401_whatever_its_body(
    client: httpx.AsyncClient, method: str, path: str, body: bytes
) -> None:
    for headers in ({}, bearer("not-a-token")):
        response = await client.request(
            method, path, content=body, headers={"Content-Type": "application/json", **headers}
        )
        assert response.status_code == 401, response.text
        assert response.headers["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "path"), WRITES)
async def test_a_write_by_a_non_admin_is_403_whatever_its_body(
    client: httpx.AsyncClient, tokens: Tokens, method: str, path: str
) -> None:
    response = await client.request(
        method, path, content=b"{", headers={"Content-Type": "application/json", **bearer(tokens.reader)}
    )
    assert response.status_code == 403, response.text


async def test_an_admin_with_a_bad_body_is_told_what_is_wrong(
    client: httpx.AsyncClient, tokens: Tokens
) -> None:
    headers = {"Content-Type": "application/json", **bearer(tokens.admin)}
    response = await client.put("/defaults", content=b"{", headers=headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == "json_invalid"


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("/defaults", {"GET", "PUT"}),
        ("/namespaces/team-a/budget", {"GET", "PUT", "DELETE"}),
        ("/namespaces/team-a/grants", {"GET", "POST"}),
        ("/namespaces/team-a/grants/1", {"DELETE"}),
    ],
)
async def test_options_and_405_list_every_method_of_the_path(
    client: httpx.AsyncClient, path: str, methods: set[str]
) -> None:
    options = await client.options(path)
    assert options.status_code == 204
    offered = methods | {"OPTIONS"}
    assert set(options.headers["Allow"].split(", ")) == offered
    wrong = await client.patch(path)
    assert wrong.status_code == 405
    assert set(wrong.headers["Allow"].split(", ")) == offered


async def test_options_of_an_unknown_path_is_404(client: httpx.AsyncClient) -> None:
    assert (await client.options("/nothing-here")).status_code == 404


def _readyz_client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://timekeeper")


async def test_readyz_shows_the_replica_and_jobs_only_to_an_authenticated_reader(
    app: FastAPI, tokens: Tokens, settings: Settings, clock: ManualClock
) -> None:
    context = current(app)
    runner = PeriodicRunner(str(settings.database_url), context.sessions, settings, clock)
    expose(app, replace(context, scheduler=runner))  # built, never started: its status is what /readyz shows
    try:
        async with _readyz_client(app) as client:
            anonymous = await client.get("/readyz")
            reader = await client.get("/readyz", headers=bearer(tokens.reader))
            stranger = await client.get("/readyz", headers=bearer("not-a-token"))
    finally:
        expose(app, context)

    assert anonymous.json() == {"status": "ready"}
    assert reader.json() == {"status": "ready", "scheduler": runner.status()}
    assert runner.replica == replica_name() and runner.replica in reader.text
    assert stranger.status_code == 401


async def test_the_openapi_document_says_which_strings_an_amount_accepts(client: httpx.AsyncClient) -> None:
    async with _readyz_client(client._transport.app) as root:  # type: ignore[attr-defined]
        schemas = (await root.get("/openapi.json")).json()["components"]["schemas"]
    for model, field in (("BudgetIn", "budget_gpu_minutes"), ("GrantIn", "gpu_minutes")):
        accepted = schemas[model]["properties"][field]
        strings = [s for s in _alternatives(accepted) if s.get("type") == "string"]
        assert strings and all("pattern" in s for s in strings), accepted
        assert any(s.get("type") == "number" for s in _alternatives(accepted)), accepted


async def test_the_openapi_document_names_the_cluster_header_and_each_answers_cluster(
    client: httpx.AsyncClient,
) -> None:
    async with _readyz_client(client._transport.app) as root:  # type: ignore[attr-defined]
        document = (await root.get("/openapi.json")).json()
    for path, method in (
        ("/namespaces/{namespace}/budget", "get"),
        ("/namespaces", "get"),
        ("/admission-state", "get"),
        ("/whoami", "get"),
        ("/reports", "post"),
    ):
        parameters = document["paths"][API_PREFIX + path][method]["parameters"]
        headers = [p["name"] for p in parameters if p["in"] == "header"]
        assert headers.count(CLUSTER_HEADER) == 1, path
    schemas = document["components"]["schemas"]
    for model in (
        "NamespaceBudgetOut",
        "GrantEntryOut",
        "GrantOut",
        "UsageOut",
        "EfficiencyOut",
        "IdlePodOut",
    ):
        properties = schemas[model]["properties"]
        assert "namespace" in properties and "null" in str(properties["cluster"]), model
    # A pool's members are keys (admin input that may span clusters), and the document says so.
    assert "namespace key" in schemas["PoolMemberOut"]["properties"]["namespace"]["description"]


def _alternatives(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return schema.get("anyOf", [schema])


@pytest.mark.parametrize("amount", ["0E-20000", "0." + "0" * 70 + "1", "1_000", " 1.5"])
async def test_an_amount_string_outside_the_documented_form_is_422(
    client: httpx.AsyncClient, tokens: Tokens, amount: str
) -> None:
    """ "0E-20000" passed pydantic and overflowed PostgreSQL's numeric (a 500) until the form was bounded."""
    response = await client.put(
        "/namespaces/team-a/budget", json={"budget_gpu_minutes": amount}, headers=bearer(tokens.admin)
    )
    assert response.status_code == 422, response.text


async def test_an_amount_string_in_the_documented_form_is_taken(
    client: httpx.AsyncClient, tokens: Tokens
) -> None:
    response = await client.put(
        "/namespaces/team-a/budget", json={"budget_gpu_minutes": "1.5e2"}, headers=bearer(tokens.admin)
    )
    assert response.status_code == 200, response.text
    assert response.json()["budget_gpu_minutes"] == 150
