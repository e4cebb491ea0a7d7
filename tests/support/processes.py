"""The deployables as real processes, the way their images run them: `python -m timekeeper`,
`python -m webhook`, `python -m sidecar`; plus the waiting and port helpers every end-to-end test needs."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.engine import URL

from tests.support.postgres import url_string

REPO_ROOT = Path(__file__).resolve().parents[2]
# Plain-HTTP calls to the processes under test: one client, as making one (httpx.get does) loads the CA
# bundle, a tenth of a second on a busy machine; it keeps no connection, so none holds up a process's exit.
LOCAL_HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def wait_until(condition: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll until `condition()` holds; fail the test with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class TimekeeperProcess:
    """`python -m timekeeper` on a fixed port, stoppable and restartable against the same database."""

    def __init__(
        self, database: URL, env: dict[str, str], port: int, log_path: Path, host: str = "127.0.0.1"
    ) -> None:
        self.port = port
        self.host = host
        self.log_path = log_path
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "TIMEKEEPER_DATABASE_URL": url_string(database),
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"http://{host}:{port}"

    def start(self) -> None:
        self.launch()
        self.wait_healthy()

    def launch(self) -> None:
        """The process, not waiting for it: start others beside it, then wait_healthy()."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "timekeeper", "--host", self.host, "--port", str(self.port)),
                    *("--log-level", "warning"),
                ],
                cwd=REPO_ROOT,
                env=self.env,
                stdout=log,
                stderr=log,
            )

    def wait_healthy(self) -> None:
        wait_until(self.healthy, timeout=60, what=f"the timekeeper on port {self.port}")

    def healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"timekeeper exited: {self.log_path.read_text()[-3000:]}")
        try:
            return LOCAL_HTTP.get(f"{self.url}/api/v1/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


class SidecarProcess:
    """One sidecar process (or, with `module="nodeagent"`, a node agent); its stderr (the JSON log) goes
    to a file that `events()` parses."""

    def __init__(self, env: dict[str, str], log_path: Path, module: str = "sidecar") -> None:
        self.log_path = log_path
        full_env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO_ROOT), **env}
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", module],
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


class WebhookProcess:
    """`python -m webhook` over HTTPS on 127.0.0.1, trusted through the CA that signed its certificate."""

    def __init__(self, env: dict[str, str], port: int, ca_pem: bytes, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}
        self.url = f"https://127.0.0.1:{port}"
        self.client = httpx.Client(verify=ssl.create_default_context(cadata=ca_pem.decode()), timeout=5)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.launch()
        self.wait_healthy()

    def launch(self) -> None:
        """The process, not waiting for it: start others beside it, then wait_healthy()."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "webhook", "--host", "127.0.0.1", "--port", str(self.port)],
                cwd=REPO_ROOT,
                env=self.env,
                stdout=log,
                stderr=log,
            )

    def wait_healthy(self) -> None:
        wait_until(self.healthy, timeout=60, what=f"the webhook on port {self.port}")

    def healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"webhook exited: {self.log_path.read_text()[-3000:]}")
        try:
            return self.client.get(f"{self.url}/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.client.close()  # first, so the server has no keep-alive connection to wait for
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)
