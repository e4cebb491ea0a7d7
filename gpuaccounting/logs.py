"""Structured logging for every deployable: JSON lines in clusters, readable lines locally. Events are
snake_case names logged as the message, their fields in `extra`; both formats carry every field."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["auto", "json", "text"]

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD_ATTRIBUTES = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "taskName", "color_message"}
)


def _extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {key: value for key, value in record.__dict__.items() if key not in _STANDARD_ATTRIBUTES}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, event, then the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            **_extra_fields(record),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """`12:00:01 info  timekeeper.usage namespace_state_changed namespace=team-a new=exhausted`."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, UTC).strftime("%H:%M:%S")
        fields = " ".join(f"{key}={value}" for key, value in _extra_fields(record).items())
        line = f"{moment} {record.levelname.lower():<7} {record.name} {record.getMessage()} {fields}".rstrip()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(log_format: LogFormat = "auto", level: str = "INFO") -> None:
    """Route the root logger to stderr in the chosen format; `auto` is JSON unless stderr is a terminal."""
    if log_format == "auto":
        log_format = "text" if sys.stderr.isatty() else "json"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
