"""`python -m webhook` as the cluster runs it: a real process serving HTTPS from the TLS files in its env."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time

import httpx

from tests.support.admission_state_server import run_state_server, snapshot
from tests.support.pods import container, pod
from tests.webhook.conftest import Tls, free_port, review


def test_module_serves_https_with_the_state_from_the_timekeeper(tls: Tls) -> None:
    port = free_port()
    with run_state_server(snapshot(version=5)) as state:
        env = {
            **os.environ,
            "WEBHOOK_TLS_CERT_FILE": str(tls.cert_file),
            "WEBHOOK_TLS_KEY_FILE": str(tls.key_file),
            "WEBHOOK_TIMEKEEPER_URL": state.url,
            "WEBHOOK_STATE_POLL_INTERVAL_SECONDS": "0.1",
        }
        child = subprocess.Popen(
            [sys.executable, "-m", "webhook", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            client = httpx.Client(verify=ssl.create_default_context(cafile=str(tls.ca_file)), timeout=5)
            deadline = time.monotonic() + 20
            while True:
                try:
                    metrics = client.get(f"https://localhost:{port}/metrics").text
                    if "webhook_state_version 5.0" in metrics:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "the webhook process did not come up with the state"
                time.sleep(0.1)
            answer = client.post(
                f"https://localhost:{port}/mutate", json=review(pod(container("m", {"nvidia.com/gpu": 1})))
            )
            assert answer.json()["response"]["patchType"] == "JSONPatch"
            client.close()
        finally:
            child.terminate()
            child.wait(timeout=10)


def test_module_refuses_to_start_without_tls() -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("WEBHOOK_TLS")}
    result = subprocess.run(
        [sys.executable, "-m", "webhook"], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "WEBHOOK_TLS_CERT_FILE and WEBHOOK_TLS_KEY_FILE are required" in result.stderr
