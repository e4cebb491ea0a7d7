"""Request bodies parsed as strict JSON (RFC 8259) by a dependency, after the caller is authorized.
Rules: orjson refuses NaN, Infinity, 1e400 and lone surrogates (422 `json_invalid`, never a 500 that
cannot echo them back); an object with a repeated key is refused (`"gpu_share": 0.5, "gpu_share": 200`
would charge 200); `strict_body(Model, guard)` depends on its guard, so 401 and 403 come before any 422."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema

from httpguard.nesting import deeper_than
from timekeeper.auth.base import Action, Principal
from timekeeper.auth.dependencies import require
from timekeeper.errors import TimekeeperError

Model = TypeVar("Model", bound=BaseModel)
# How deep a body may nest: deeper than any body the API reads (a report is 3 levels), and refused before
# the recursive steps below (the member counts, the standard parser naming a repeated key).
MAX_BODY_DEPTH = 32


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
    """Whether the body wrote more object members than the parsed value kept: counted on the parsed
    strings when the body has no backslash, else on the strings taken out of the text."""
    if b"\\" not in body:
        return _colons(value) != body.count(b":")
    return _members(value) != _STRING.sub(b"", body).count(b":")


def loads_strict(body: bytes) -> Any:
    """The body as JSON, or json.JSONDecodeError for anything not strict RFC 8259 JSON or with a key
    repeated in one object: orjson decides strictness, member counts find a repeat, and only then does
    the standard parser name the repeated key; a body nested deeper than MAX_BODY_DEPTH is refused first."""
    value = orjson.loads(body)
    if deeper_than(value, MAX_BODY_DEPTH):
        raise json.JSONDecodeError(f"nested deeper than {MAX_BODY_DEPTH} levels", body.decode(), 0)
    if isinstance(value, dict | list) and _repeats_a_key(value, body):
        try:
            json.loads(body, object_pairs_hook=_unique_keys)
        except ValueError as error:
            raise json.JSONDecodeError(str(error), body.decode(), 0) from None
    return value


async def json_body(request: Request, model: type[Model]) -> Model:
    """The request's body validated as `model`, refused as FastAPI refuses a declared body (422 with
    pydantic's errors under "body")."""
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


# The model each body-reading dependency parses, for the OpenAPI document.
_BODY_MODELS: dict[Callable[..., Any], type[BaseModel]] = {}
Dependency = TypeVar("Dependency", bound=Callable[..., Any])


def reads_body(model: type[BaseModel]) -> Callable[[Dependency], Dependency]:
    """Marks a dependency that reads the body as `model` (json_body), so the OpenAPI documents it."""

    def mark(dependency: Dependency) -> Dependency:
        _BODY_MODELS[dependency] = model
        return dependency

    return mark


def strict_body(
    model: type[Model], guard: Callable[..., Awaitable[Principal]]
) -> Callable[..., Awaitable[Model]]:
    """A dependency: the body as `model`, read only once `guard` (itself a dependency, shared with the
    endpoint through FastAPI's per-request cache) has let the caller in."""

    @reads_body(model)
    async def body(request: Request, _: Principal = Depends(guard)) -> Model:  # noqa: B008
        return await json_body(request, model)

    return body


def _body_model(dependant: Dependant) -> type[BaseModel] | None:
    for dependency in dependant.dependencies:
        model = _BODY_MODELS.get(dependency.call) if dependency.call else None  # type: ignore[arg-type]
        if model is None:
            model = _body_model(dependency)
        if model is not None:
            return model
    return None


def document_strict_bodies(app: FastAPI, prefix: str, routers: Iterable[APIRouter]) -> None:
    """Documents each route's reads_body model (the routers', included under `prefix`) as FastAPI
    documents a declared JSON body: a required requestBody referring to the model's schema."""
    bodies = {
        (prefix + route.path_format, method.lower()): model
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute) and route.include_in_schema
        if (model := _body_model(route.dependant)) is not None
        for method in route.methods or ()
    }
    _, schemas = models_json_schema(
        [(model, "validation") for model in sorted(set(bodies.values()), key=lambda model: model.__name__)],
        ref_template="#/components/schemas/{model}",
    )
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        document.setdefault("components", {}).setdefault("schemas", {}).update(schemas.get("$defs", {}))
        for (path, method), model in bodies.items():
            document["paths"][path][method]["requestBody"] = {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
                },
            }
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def admin_body(model: type[BaseModel]) -> Any:
    """`Annotated[Model, admin_body(Model)]`: an admin write's body, read once the caller is an admin."""
    return Depends(strict_body(model, require(Action.ADMIN)))
