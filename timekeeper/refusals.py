"""The one handler that renders every refusal as `{"detail": ...}`; a database outage is rendered by it
too, as a 503 with Retry-After."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException
from starlette.routing import Match

from timekeeper.db.outage import RETRY_AFTER_SECONDS, is_outage
from timekeeper.errors import TimekeeperError


def unavailable() -> TimekeeperError:
    return TimekeeperError(
        "the database does not answer; retry later", 503, {"Retry-After": str(RETRY_AFTER_SECONDS)}
    )


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def _allowed_methods(request: Request) -> str:
    """Every method the app routes at this path: Starlette's 405 names only the first route's (GET for
    /defaults, whose PUT is another route). Asked of the routes themselves, as routing does."""
    routes = request.app.router.routes
    allowed = [
        method
        for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)
    ]
    return ", ".join([*allowed, "OPTIONS"])


async def _handle(request: Request, error: Exception) -> Response:
    if isinstance(error, SQLAlchemyError):
        if not is_outage(error):
            raise error  # a bug: the server's 500, with its traceback logged
        error = unavailable()
    if isinstance(error, HTTPException) and error.status_code == 405:
        allow = {"Allow": _allowed_methods(request)}
        if request.method == "OPTIONS":  # what the path offers, answered rather than refused
            return Response(status_code=204, headers=allow)
        return JSONResponse({"detail": error.detail}, status_code=405, headers=allow)
    if isinstance(error, TimekeeperError):
        return JSONResponse({"detail": error.message}, status_code=error.status_code, headers=error.headers)
    if isinstance(error, RequestValidationError):
        return await request_validation_exception_handler(request, error)
    assert isinstance(error, HTTPException)
    return await http_exception_handler(request, error)


# What the handler answers: a refusal, or a database outage (a 503).
REFUSALS = (TimekeeperError, RequestValidationError, HTTPException, SQLAlchemyError)


def install_error_handler(app: FastAPI) -> None:
    for error_type in REFUSALS:
        app.add_exception_handler(error_type, _handle)
