"""Request bodies declared as FastAPI declares them (`body: BudgetIn`), read as strict JSON (RFC 8259) and
refused only after the caller is authorized. Rules: only application/json; orjson refuses NaN, Infinity,
1e400 and lone surrogates (422 `json_invalid`, never a 500 that cannot echo them back); an object with a
repeated key is refused (`"gpu_share": 0.5, "gpu_share": 200` would charge 200); so is a body nested
deeper than MAX_BODY_DEPTH. FastAPI decodes a body before it solves the dependencies; StrictRoute hands
it a body it refuses as a value no model accepts, and raises the refusal in place of the validation
errors FastAPI raises once the dependencies have run, so 401 and 403 come first; a caller with no
credential at all is refused before its body is read."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from httpguard.nesting import deeper_than
from timekeeper.auth.dependencies import refuse_anonymous
from timekeeper.errors import TimekeeperError

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


# What a body that is not strict JSON is read as: a value no body model accepts (pydantic takes no fields
# from a bare object: model_attributes_type), so that FastAPI finds the body invalid where it validates
# it, after the dependencies.
_UNREAD = object()


def _is_json(request: Request) -> bool:
    return request.headers.get("content-type", "").partition(";")[0].strip().lower() == "application/json"


class StrictRequest(Request):
    """A request whose JSON body is read by loads_strict; one it refuses is kept for `refusal`."""

    _malformed: json.JSONDecodeError | None = None

    async def json(self) -> Any:
        if not _is_json(self):  # FastAPI reads application/*+json too
            return _UNREAD
        try:
            return loads_strict(await self.body())
        except json.JSONDecodeError as error:
            self._malformed = error
            return _UNREAD

    async def refusal(self) -> Exception | None:
        """What refuses the body before its fields are looked at: a content type other than
        application/json (422), or a body that is not strict JSON, an empty one included (422 as FastAPI
        refuses JSON it cannot decode)."""
        if not _is_json(self):
            return TimekeeperError("the body must be application/json", 422)
        if self._malformed is None and not await self.body():
            await self.json()  # FastAPI calls an empty body missing: orjson says what it is
        if self._malformed is None:
            return None
        error = self._malformed
        return RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", error.pos),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": error.msg},
                }
            ]
        )


class StrictRoute(APIRoute):
    """A route whose body is read as strict JSON (StrictRequest). A body it cannot read is refused where
    FastAPI refuses a body's fields, once the dependencies (the caller's authorization) have run."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        if self.body_field is None:
            return handle

        async def strict(request: Request) -> Response:
            await refuse_anonymous(request)
            strict_request = StrictRequest(request.scope, request.receive)
            try:
                return await handle(strict_request)
            except RequestValidationError:
                refusal = await strict_request.refusal()
                if refusal is None:
                    raise
                raise refusal from None

        return strict
