"""The sidecar's event lines (through gpuaccounting.logs): the pod bound to every line, debug on demand."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from sidecar.logs import configure


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_the_event_the_pod_and_the_fields(capsys: pytest.CaptureFixture[str]) -> None:
    log = configure("json", False, namespace="team-a", pod="trainer-0")

    log.warning("gpu_lost", gpu="GPU-1")
    log.debug("interval_cut", seq=3)

    (line,) = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["event"] == "gpu_lost" and record["level"] == "warning"
    assert (record["namespace"], record["pod"], record["gpu"]) == ("team-a", "trainer-0", "GPU-1")


def test_debug_lines_only_when_asked_in_text(capsys: pytest.CaptureFixture[str]) -> None:
    log = configure("text", True, namespace="team-a", pod="trainer-0")

    log.debug("interval_cut", seq=3)

    line = capsys.readouterr().err.strip()
    assert "debug" in line and "interval_cut" in line and "seq=3" in line and "pod=trainer-0" in line
