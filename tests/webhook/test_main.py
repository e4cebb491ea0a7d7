"""`python -m webhook` as the cluster runs it: a real process serving HTTPS from the TLS files in its env."""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from tests.support.admission_state_server import run_state_server, snapshot
from tests.support.pods import container, pod, review
from tests.support.processes import free_port
from tests.webhook.conftest import Tls, running_module
from webhook.__main__ import main
from webhook.certificates.devcert import DEV_CERT_DIR


@pytest.mark.e2e  # a real `python -m` process over real sockets
def test_module_serves_https_with_the_state_from_the_timekeeper(tls: Tls) -> None:
    port = free_port()
    client = httpx.Client(verify=ssl.create_default_context(cafile=str(tls.ca_file)), timeout=5)
    with run_state_server(snapshot(version=5)) as state:
        env = {
            "WEBHOOK_TLS_CERT_FILE": str(tls.cert_file),
            "WEBHOOK_TLS_KEY_FILE": str(tls.key_file),
            "WEBHOOK_TIMEKEEPER_URL": state.url,
            "WEBHOOK_STATE_POLL_INTERVAL_SECONDS": "0.1",
            "WEBHOOK_WATCH_PRIORITY_CLASSES": "false",
        }

        def has_the_state() -> bool:
            return "webhook_state_version 5.0" in client.get(f"https://localhost:{port}/metrics").text

        with running_module("webhook", port, env, has_the_state) as child, contextlib.closing(client):
            answer = client.post(
                f"https://localhost:{port}/mutate", json=review(pod(container("m", {"nvidia.com/gpu": 1})))
            )
            assert answer.json()["response"]["patchType"] == "JSONPatch"
    assert child.stderr is not None
    log = child.stderr.read().decode()
    assert f"Uvicorn running on https://127.0.0.1:{port}" in log  # the scheme it serves, not http://


def test_module_refuses_to_start_without_tls() -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("WEBHOOK_TLS")}
    result = subprocess.run(
        [sys.executable, "-m", "webhook"], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "WEBHOOK_TLS_CERT_FILE and WEBHOOK_TLS_KEY_FILE are required" in result.stderr


def test_module_refuses_to_start_when_the_priority_class_watch_has_no_cluster(
    tls: Tls, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "WEBHOOK_TLS_CERT_FILE": str(tls.cert_file),
        "WEBHOOK_TLS_KEY_FILE": str(tls.key_file),
        "WEBHOOK_KUBECONFIG": str(tmp_path / "absent"),
        "WEBHOOK_WATCH_PRIORITY_CLASSES": "true",
    }
    result = subprocess.run(
        [sys.executable, "-m", "webhook", "--host", "127.0.0.1", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert f"no kubeconfig at {tmp_path / 'absent'}" in result.stderr
    assert "WEBHOOK_WATCH_PRIORITY_CLASSES=false" in result.stderr


def test_dev_cert_writes_a_pair_for_localhost_outside_git(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["dev-cert", "--out", str(tmp_path / "tls")])
    exported = dict(
        line.removeprefix("export ").split("=", 1) for line in capsys.readouterr().out.splitlines()
    )
    assert set(exported) == {"WEBHOOK_TLS_CERT_FILE", "WEBHOOK_TLS_KEY_FILE"}
    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
        exported["WEBHOOK_TLS_CERT_FILE"], exported["WEBHOOK_TLS_KEY_FILE"]
    )
    certificate = x509.load_pem_x509_certificate(Path(exported["WEBHOOK_TLS_CERT_FILE"]).read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert Path(exported["WEBHOOK_TLS_KEY_FILE"]).stat().st_mode & 0o077 == 0  # the key is the owner's alone
    # The default folder is ignored by git, so a development key is never committed.
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{DEV_CERT_DIR}/tls.key"], check=False)
    assert ignored.returncode == 0
