"""One error type for everything the timekeeper refuses, rendered by one handler as `{"detail": ...}`;
a database outage is rendered by it too, as a 503 with Retry-After.

Rejected reports are counted here too, whatever refused them (validation, auth, limits).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException

from gpuaccounting.names import REPORTS_PATH
from timekeeper.db.outage import RETRY_AFTER_SECONDS, is_outage


class TimekeeperError(Exception):
    def __init__(self, message: str, status_code: int = 400, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.headers = headers


def _count_rejected(request: Request) -> None:
    if request.url.path == REPORTS_PATH and request.method == "POST":
        request.app.state.metrics.reports.labels(result="rejected").inc()


def unavailable() -> TimekeeperError:
    return TimekeeperError(
        "the database does not answer; retry later", 503, {"Retry-After": str(RETRY_AFTER_SECONDS)}
    )


async def _handle(request: Request, error: Exception) -> Response:
    if isinstance(error, SQLAlchemyError):
        if not is_outage(error):
            raise error  # a bug: the server's 500, with its traceback logged
        error = unavailable()
    _count_rejected(request)
    if isinstance(error, TimekeeperError):
        return JSONResponse({"detail": error.message}, status_code=error.status_code, headers=error.headers)
    if isinstance(error, RequestValidationError):
        return await request_validation_exception_handler(request, error)
    assert isinstance(error, HTTPException)
    return await http_exception_handler(request, error)


def install_error_handler(app: FastAPI) -> None:
    for error_type in (TimekeeperError, RequestValidationError, HTTPException, SQLAlchemyError):
        app.add_exception_handler(error_type, _handle)
