"""One error type for everything the timekeeper refuses; `timekeeper.refusals` renders it."""

from __future__ import annotations


class TimekeeperError(Exception):
    def __init__(self, message: str, status_code: int = 400, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.headers = headers
