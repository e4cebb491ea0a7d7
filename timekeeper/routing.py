"""Request bodies parsed as strict JSON (RFC 8259), so nothing malformed reaches validation, and only
once the caller is known to be allowed to send them.

Python's json module accepts `NaN` and `Infinity`, reads `1e400` as infinity and lone surrogates
(`"\\ud800"`) as text; pydantic then refuses them, but the 422 that echoes the input back cannot be
rendered (non-finite floats and surrogates are not JSON), so the client got a 500. orjson refuses all of them
while parsing, which FastAPI answers as a 422 `json_invalid`. Every JSON parser keeps the last of duplicate
keys (`"gpu_share": 0.5, "gpu_share": 200` would charge 200), so an object with a repeated key is refused too.

FastAPI reads and parses a body before it resolves the route's dependencies, so a write without a token
but with broken JSON answered 422, telling an anonymous client about the body's shape. A route whose
dependencies require an action (`timekeeper.auth.dependencies.require`) authorizes the caller first:
401 or 403 before any 422. (FastAPI's own dependency then authorizes again, from the token cache.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.routing import request_response

from timekeeper.auth.base import Action
from timekeeper.auth.dependencies import authenticated, authorize
from timekeeper.errors import TimekeeperError
from timekeeper.schemas import NamespaceName

Model = TypeVar("Model", bound=BaseModel)
T = TypeVar("T")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        keys = [key for key, _ in pairs]
        raise ValueError(f"duplicate key {next(key for key in keys if keys.count(key) > 1)!r}")
    return value


# A JSON string. In a document orjson accepted, every ':' outside one separates an object member's key
# from its value, so their count is the number of members the text holds.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def _members(value: Any) -> int:
    """How many object members the parsed document kept (a repeated key keeps one)."""
    if isinstance(value, dict):
        return len(value) + sum(_members(item) for item in value.values())
    if isinstance(value, list):
        return sum(_members(item) for item in value)
    return 0


def _colons(value: Any) -> int:
    """The ':' the parsed document's text holds where none of its strings had an escape: one per object
    member kept, plus those inside its keys and string values."""
    if isinstance(value, str):
        return value.count(":")
    if isinstance(value, dict):
        count = len(value)
        for key, item in value.items():
            count += key.count(":") + _colons(item)
        return count
    if isinstance(value, list):
        count = 0
        for item in value:
            count += _colons(item)
        return count
    return 0


def _repeats_a_key(value: Any, body: bytes) -> bool:
    """Whether the body wrote more object members than the parsed value kept. Without a backslash in
    the body no string has an escape, so its strings parsed are its strings written and their colons
    are counted from the parsed value, with no pass over the text in Python (the regex that takes the
    strings out costs several times orjson's parse); with one, the strings are taken out of the text."""
    if b"\\" not in body:
        return _colons(value) != body.count(b":")
    return _members(value) != _STRING.sub(b"", body).count(b":")


def loads_strict(body: bytes) -> Any:
    """The body as JSON, or json.JSONDecodeError (orjson's is one) for anything not strict RFC 8259
    JSON or with a key repeated in one object. orjson decides strictness. A repeated key is found by
    counting: fewer members parsed than written means one was repeated (a few µs, where a second parse
    with the standard parser cost four times orjson's); only then does the standard parser, given only
    what orjson accepted, name the key."""
    value = orjson.loads(body)
    if isinstance(value, dict | list) and _repeats_a_key(value, body):
        try:
            json.loads(body, object_pairs_hook=_unique_keys)
        except ValueError as error:
            raise json.JSONDecodeError(str(error), body.decode(), 0) from None
    return value


async def json_body(request: Request, model: type[Model]) -> Model:
    """The request's body validated as `model`, refused as FastAPI refuses a declared body (422 with
    pydantic's errors under "body"), for an endpoint that must act before the body is read."""
    if request.headers.get("content-type", "").partition(";")[0].strip().lower() != "application/json":
        raise TimekeeperError("the body must be application/json", 422)
    body = await request.body()
    try:
        value = loads_strict(body)
    except json.JSONDecodeError as error:
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", error.pos),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": error.msg},
                }
            ]
        ) from None
    try:
        return model.model_validate(value)
    except ValidationError as error:
        raise RequestValidationError(
            [{**detail, "loc": ("body", *detail["loc"])} for detail in error.errors(include_url=False)]
        ) from None


# What FastAPI documents for a declared NamespacePath and a bearer token, for RequestRoute operations.
NAMESPACE: TypeAdapter[str] = TypeAdapter(NamespaceName)
NAMESPACE_PARAMETER: dict[str, Any] = {
    "name": "namespace",
    "in": "path",
    "required": True,
    "schema": {**NAMESPACE.json_schema(), "title": "Namespace"},
    "description": "a namespace",
}
BEARER: dict[str, Any] = {"security": [{"HTTPBearer": []}]}


def path_param(request: Request, name: str, adapter: TypeAdapter[T]) -> T:
    """A path parameter validated as FastAPI validates a declared one (422, pydantic's errors under
    "path"), for an endpoint that takes the Request alone."""
    try:
        return adapter.validate_python(request.path_params[name])
    except ValidationError as error:
        raise RequestValidationError(
            [{**detail, "loc": ("path", name, *detail["loc"])} for detail in error.errors(include_url=False)]
        ) from None


_WITH_BODY = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _required_action(route: APIRoute) -> Action | None:
    return next(
        (
            action
            for dependency in route.dependant.dependencies
            if (action := getattr(dependency.call, "action", None))
        ),
        None,
    )


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_strict(await self.body())
        return self._json


class StrictJsonRoute(APIRoute):
    """A route whose handler reads the body through StrictJsonRequest (FastAPI's custom route class)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        action = _required_action(self)

        async def strict(request: Request) -> Response:
            strict_request = StrictJsonRequest(request.scope, request.receive)
            if action is not None and request.method in _WITH_BODY:
                principal = await authenticated(strict_request)
                await authorize(
                    strict_request, principal, action, strict_request.path_params.get("namespace")
                )
            return await handler(strict_request)

        return strict


class RequestRoute(APIRoute):
    """A route whose endpoint takes the Request alone and answers a Response itself (POST /reports, which
    reads its body only once the caller is authenticated). FastAPI's request handler would have nothing
    to resolve for it but would still cost about as much CPU as the endpoint, and its wrapper opens two
    exit stacks for dependencies it has none of (docs/performance.md); Starlette's plain wrapper calls
    the endpoint, its errors answered by the app's handlers. Declared and documented as any other."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        self.app = request_response(endpoint)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint: Callable[[Request], Coroutine[Any, Any, Response]] = self.endpoint
        return endpoint
