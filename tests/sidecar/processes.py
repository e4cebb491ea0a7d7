"""Run `python -m sidecar` as a real process, the way the pod runs it, and wait on what it reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def wait_until(condition: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll until `condition()` holds; fail the test with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class SidecarProcess:
    """One sidecar process; its stderr (the JSON log) goes to a file that `events()` parses."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        full_env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO_ROOT), **env}
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sidecar"],
                cwd=REPO_ROOT,
                env=full_env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def events(self) -> list[dict[str, Any]]:
        lines = self.log_path.read_text().splitlines() if self.log_path.exists() else []
        parsed = []
        for line in lines:
            try:
                parsed.append(json.loads(line))
            except ValueError:
                parsed.append({"event": "unparsed", "line": line})
        return parsed

    def event_names(self) -> list[str]:
        return [event.get("event", "") for event in self.events()]

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM, as the kubelet sends it; answers the exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL: no chance to flush anything."""
        self.process.kill()
        self.process.wait(timeout=10)
