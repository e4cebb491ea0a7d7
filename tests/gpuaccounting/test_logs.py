"""Log lines keep their event name and every field, in both formats."""

import json
import logging

from gpuaccounting.logs import JsonFormatter, TextFormatter


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "timekeeper.usage", logging.WARNING, __file__, 1, "namespace_state_changed", None, None
    )
    record.__dict__.update(extra)
    return record


def test_json_lines_carry_event_and_fields() -> None:
    line = JsonFormatter().format(_record(namespace="team-a", new="exhausted"))
    entry = json.loads(line)
    assert entry["event"] == "namespace_state_changed"
    assert entry["level"] == "warning"
    assert entry["namespace"] == "team-a"
    assert entry["new"] == "exhausted"
    assert entry["time"].endswith("Z")


def test_text_lines_are_readable_and_keep_fields() -> None:
    line = TextFormatter().format(_record(namespace="team-a", pod="train-0"))
    assert "warning" in line
    assert "namespace_state_changed namespace=team-a pod=train-0" in line


def test_exceptions_are_kept_in_json() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "job_failed", None, sys.exc_info())
    entry = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in entry["exception"]
