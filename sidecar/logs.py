"""Structured logging: one JSON object a line in clusters, readable text locally.

Every line carries the namespace and pod, so a cluster's log pipeline can find a pod's sidecar lines.
Events are snake_case names; the sidecar logs changes of state, not a line per sample.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from sidecar.config import LogFormat

LOGGER_NAME = "sidecar"


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", {})
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": record.getMessage(),
            **fields,
        }
        return json.dumps(line, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", {})
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        details = " ".join(f"{key}={value}" for key, value in fields.items())
        return f"{stamp} {record.levelname.lower():7} {record.getMessage()} {details}".rstrip()


class EventLog:
    """A logger bound to the pod: `log.info("report_sent", seq=3)`."""

    def __init__(self, logger: logging.Logger, **bound: Any) -> None:
        self._logger = logger
        self._bound = bound

    def _emit(self, level: int, event: str, fields: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, extra={"fields": {**self._bound, **fields}})

    def debug(self, event: str, **fields: Any) -> None:
        self._emit(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit(logging.ERROR, event, fields)


def configure(log_format: LogFormat, debug: bool, **bound: Any) -> EventLog:
    """Send the sidecar's events to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if log_format == "json" else _TextFormatter())
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG if debug else logging.INFO)
    return EventLog(logger, **bound)
