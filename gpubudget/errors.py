"""The one error the CLI reports: a sentence for the user, and the exit code."""

from __future__ import annotations


class CliError(Exception):
    """Printed as `error: <message>` on stderr; nothing else is printed."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
