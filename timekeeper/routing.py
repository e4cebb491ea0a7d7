"""Request bodies parsed as strict JSON (RFC 8259), so nothing malformed reaches validation, and only
once the caller is known to be allowed to send them.

Python's json module accepts `NaN` and `Infinity`, reads `1e400` as infinity and lone surrogates
(`"\\ud800"`) as text; pydantic then refuses them, but the 422 that echoes the input back cannot be
rendered (non-finite floats and surrogates are not JSON), so the client got a 500. orjson refuses all of them
while parsing, which FastAPI answers as a 422 `json_invalid`.

FastAPI reads and parses a body before it resolves the route's dependencies, so a write without a token
but with broken JSON answered 422, telling an anonymous client about the body's shape. A route whose
dependencies require an action (`timekeeper.auth.dependencies.require`) authorizes the caller first:
401 or 403 before any 422. (FastAPI's own dependency then authorizes again, from the token cache.)
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute

from timekeeper.auth.base import Action
from timekeeper.auth.dependencies import authorize, bearer_principal

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
            self._json = orjson.loads(await self.body())
        return self._json


class StrictJsonRoute(APIRoute):
    """A route whose handler reads the body through StrictJsonRequest (FastAPI's custom route class)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        action = _required_action(self)

        async def strict(request: Request) -> Response:
            strict_request = StrictJsonRequest(request.scope, request.receive)
            if action is not None and request.method in _WITH_BODY:
                principal = await bearer_principal(strict_request)
                await authorize(
                    strict_request, principal, action, strict_request.path_params.get("namespace")
                )
            return await handler(strict_request)

        return strict
