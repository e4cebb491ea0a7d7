"""Request bodies parsed as strict JSON (RFC 8259), so nothing malformed reaches validation.

Python's json module accepts `NaN` and `Infinity`, reads `1e400` as infinity and lone surrogates
(`"\\ud800"`) as text; pydantic then refuses them, but the 422 that echoes the input back cannot be
rendered (non-finite floats and surrogates are not JSON), so the client got a 500. orjson refuses all of them
while parsing, which FastAPI answers as a 422 `json_invalid`.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


class StrictJsonRoute(APIRoute):
    """A route whose handler reads the body through StrictJsonRequest (FastAPI's custom route class)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strict
