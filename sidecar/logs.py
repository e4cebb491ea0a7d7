"""The sidecar's events through the structured logging all deployables share (gpuaccounting.logs): every line
names the namespace and pod; changes of state are logged, not samples."""

from __future__ import annotations

import logging
from typing import Any

from gpuaccounting.logs import LogFormat, configure_logging

LOGGER_NAME = "sidecar"


class EventLog:
    """A logger with fields bound to every line: `log.info("gpu_lost", gpu=uuid)`."""

    def __init__(self, logger: logging.Logger, **bound: Any) -> None:
        self._logger = logger
        self._bound = bound

    def _emit(self, level: int, event: str, fields: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, extra={**self._bound, **fields})

    def debug(self, event: str, **fields: Any) -> None:
        self._emit(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit(logging.ERROR, event, fields)


def configure(log_format: LogFormat, debug: bool, **bound: Any) -> EventLog:
    """Route the process's logging to stderr in the chosen format; answer the sidecar's bound event log."""
    configure_logging(log_format, "DEBUG" if debug else "INFO")
    return EventLog(logging.getLogger(LOGGER_NAME), **bound)
