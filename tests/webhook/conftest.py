"""The webhook under test: the real app served by uvicorn over real HTTPS on 127.0.0.1.

Certificates are made at run time by webhook.certificates.tls; the budget state comes from a real HTTP
stand-in for the timekeeper. Each server runs in a thread of the test process with its own settings.
"""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import orjson
import pytest

from tests.support.admission_state_server import StateServer, run_state_server, snapshot
from tests.support.pods import review
from tests.support.processes import free_port, wait_until
from webhook.certificates.tls import generate_ca, generate_serving_cert
from webhook.serving.server import server as build_server
from webhook.settings import WebhookSettings


@dataclass(frozen=True)
class Tls:
    ca_file: Path
    cert_file: Path
    key_file: Path


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    directory = tmp_path_factory.mktemp("tls")
    ca_cert, ca_key = generate_ca("gpu-timekeeper test CA")
    cert, key = generate_serving_cert(
        ca_cert, ca_key, "gpu-timekeeper-webhook", "gpu-timekeeper", extra_sans=("localhost", "127.0.0.1")
    )
    files = Tls(directory / "ca.pem", directory / "tls.crt", directory / "tls.key")
    files.ca_file.write_bytes(ca_cert)
    files.cert_file.write_bytes(cert)
    files.key_file.write_bytes(key)
    return files


@dataclass
class Answer:
    status_code: int
    body: dict[str, Any]

    @property
    def response(self) -> dict[str, Any]:
        return self.body["response"]

    @property
    def allowed(self) -> bool:
        return bool(self.response["allowed"])

    @property
    def message(self) -> str:
        return str(self.response.get("status", {}).get("message", ""))

    @property
    def patch(self) -> list[dict[str, Any]]:
        if "patch" not in self.response:
            return []
        assert self.response["patchType"] == "JSONPatch"
        return orjson.loads(base64.b64decode(self.response["patch"]))


@dataclass
class Webhook:
    url: str
    client: httpx.Client
    state: StateServer | None
    settings: WebhookSettings

    def post(self, path: str, content: bytes | dict[str, Any]) -> Answer:
        body = content if isinstance(content, bytes) else orjson.dumps(content)
        response = self.client.post(
            f"{self.url}{path}", content=body, headers={"Content-Type": "application/json"}
        )
        return Answer(response.status_code, response.json())

    def mutate(self, pod: dict[str, Any], **kwargs: Any) -> Answer:
        answer = self.post("/mutate", review(pod, **kwargs))
        assert answer.status_code == 200, answer.body
        return answer

    def validate(self, pod: dict[str, Any] | None, **kwargs: Any) -> Answer:
        answer = self.post("/validate", review(pod, **kwargs))
        assert answer.status_code == 200, answer.body
        return answer

    def admit(self, pod: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Mutate, apply the patch with a JSONPatch library, as the API server does; the mutated pod."""
        return jsonpatch.apply_patch(pod, self.mutate(pod, **kwargs).patch)

    def metric(self, name: str, **labels: str) -> float:
        text = self.client.get(f"{self.url}/metrics").text
        wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
        for line in text.splitlines():
            if line.startswith("#") or not line.startswith(name):
                continue
            series, value = line.rsplit(" ", 1)
            series_labels = series[len(name) :]
            if series_labels in ("", "{}") and not wanted:
                return float(value)
            if series_labels.startswith("{") and ",".join(sorted(series_labels[1:-1].split(","))) == wanted:
                return float(value)
        return 0.0

    def wait_until(self, condition: Callable[[], bool], timeout: float = 30.0) -> None:
        """Background work (polls, reloads) on a loaded machine: generous, and only slow when failing."""
        wait_until(condition, timeout=timeout, what="the webhook's background work")


@contextmanager
def serve_webhook(tls: Tls, state: StateServer | None, **overrides: Any) -> Iterator[Webhook]:
    """The webhook polling `state` (or the `timekeeper_url` in overrides) every 50 ms."""
    settings = WebhookSettings(
        **{
            "timekeeper_url": state.url if state else "",
            "state_poll_interval_seconds": 0.05,
            "watch_priority_classes": False,  # no API server here; tests that have one turn it on
            "tls_cert_file": tls.cert_file,
            "tls_key_file": tls.key_file,
            **overrides,
        }
    )
    port = free_port()
    server = build_server(settings, "127.0.0.1", port, log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the webhook did not start")
        time.sleep(0.01)
    context = ssl.create_default_context(cafile=str(tls.ca_file))
    client = httpx.Client(verify=context, timeout=10)
    try:
        yield Webhook(f"https://localhost:{port}", client, state, settings)
    finally:
        client.close()  # first, so the server has no keep-alive connection to wait for
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def running_module(
    module: str, port: int, env: dict[str, str], ready: Callable[[], bool], timeout: float = 60.0
) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m <module> --host 127.0.0.1 --port <port>` as a real process, until `ready()` is true."""
    child = subprocess.Popen(
        [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port)],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def up() -> bool:
        if child.poll() is not None:
            output = child.stderr.read().decode()[-2000:] if child.stderr else ""
            raise AssertionError(f"python -m {module} exited: {output}")
        try:
            return ready()
        except httpx.TransportError:
            return False

    try:
        wait_until(up, timeout=timeout, what=f"python -m {module} on port {port}")
        yield child
    finally:
        child.terminate()
        child.wait(timeout=10)


@pytest.fixture(scope="module")
def state() -> Iterator[StateServer]:
    with run_state_server(snapshot()) as served:
        yield served


@pytest.fixture(scope="module")
def webhook(tls: Tls, state: StateServer) -> Iterator[Webhook]:
    with serve_webhook(tls, state) as served:
        served.wait_until(lambda: served.metric("webhook_state_version") == state.state["version"])
        yield served


Publish = Callable[..., None]


@pytest.fixture
def publish(webhook: Webhook, state: StateServer) -> Iterator[Publish]:
    """Publish a new state version (versions only grow) and wait until the webhook has it; restored after."""

    def publish_and_wait(**kwargs: Any) -> None:
        version = state.state["version"] + 1 if state.state else 1
        state.publish(snapshot(version=version, **kwargs))
        webhook.wait_until(lambda: webhook.metric("webhook_state_version") == version)

    yield publish_and_wait
    publish_and_wait()
