"""A body nested as deep as orjson reads (1,024 levels) is a precise 422 on every endpoint that reads one,
never a 500: no step between the parse and the answer may recurse once per level (issue #38)."""

from __future__ import annotations

import pytest

from tests.support.timekeeper import Api, bearer
from timekeeper.routing import MAX_BODY_DEPTH

pytestmark = pytest.mark.asyncio(loop_scope="session")

DEPTH = 1_000
# Path parameters by name, for the routes the OpenAPI document lists.
_PATH_VALUES = {"{namespace}": "team-a", "{model}": "a100", "{name}": "pool-a"}


def _nested(opening: str, closing: str, depth: int = DEPTH, inner: str = "1") -> bytes:
    return (opening * depth + inner + closing * depth).encode()


DEEP_BODIES = {
    "arrays": _nested("[", "]"),
    "objects": _nested('{"a":', "}"),
    "objects with a key repeated at the bottom": _nested('{"a":', "}", inner='{"b":1,"b":2}'),
    # The top level is an object, as every body is; the depth is in one of its fields' values.
    "arrays in a field": b'{"namespace":' + _nested("[", "]", DEPTH - 1) + b"}",
    "objects in a field": b'{"namespace":' + _nested('{"a":', "}", DEPTH - 1) + b"}",
}


async def _body_routes(api: Api) -> list[tuple[str, str]]:
    """Every (method, path) whose OpenAPI operation documents a request body."""
    document = (await api.client.get("http://timekeeper/openapi.json")).json()
    routes = []
    for path, operations in document["paths"].items():
        for name, value in _PATH_VALUES.items():
            path = path.replace(name, value)
        routes += [
            (method.upper(), "http://timekeeper" + path)
            for method, operation in operations.items()
            if "requestBody" in operation
        ]
    return routes


async def test_every_body_route_is_found(api: Api) -> None:
    assert len(await _body_routes(api)) >= 9  # those of today; a new one is found alike


@pytest.mark.parametrize("body", DEEP_BODIES.values(), ids=DEEP_BODIES.keys())
async def test_a_deep_body_is_a_422_on_every_route_that_reads_one(api: Api, body: bytes) -> None:
    for method, path in await _body_routes(api):
        token = api.tokens.reporter if path.endswith("/reports") else api.tokens.admin
        response = await api.client.request(
            method, path, content=body, headers={**bearer(token), "Content-Type": "application/json"}
        )

        assert response.status_code == 422, (method, path, response.text[:200])
        assert f"deeper than {MAX_BODY_DEPTH}" in response.text, (method, path)


@pytest.mark.parametrize("body", DEEP_BODIES.values(), ids=DEEP_BODIES.keys())
async def test_without_a_token_a_deep_body_is_still_a_401(api: Api, body: bytes) -> None:
    response = await api.client.post("/reports", content=body, headers={"Content-Type": "application/json"})

    assert response.status_code == 401


async def test_a_body_as_deep_as_the_limit_is_refused_for_its_shape_alone(api: Api) -> None:
    """Just within the limit, the 422 that echoes the deep value back is written whole."""
    body = b'{"namespace":' + _nested("[", "]", MAX_BODY_DEPTH - 1) + b"}"
    for method, path in await _body_routes(api):
        token = api.tokens.reporter if path.endswith("/reports") else api.tokens.admin
        response = await api.client.request(
            method, path, content=body, headers={**bearer(token), "Content-Type": "application/json"}
        )

        assert response.status_code == 422, (method, path, response.text[:200])
        assert "deeper than" not in response.text, (method, path)
