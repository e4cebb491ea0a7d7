"""Fixtures for the sidecar's tests: the fake NVML library, a report receiver, an environment."""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.logs import EventLog
from tests.sidecar.receiver import ReportReceiver
from tests.support.fakenvml.fixtures import fake_nvml_library


@pytest.fixture
def receiver() -> Iterator[ReportReceiver]:
    running = ReportReceiver().start()
    yield running
    running.stop()


@pytest.fixture
def event_log() -> EventLog:
    logger = logging.getLogger("tests.sidecar.events")
    logger.setLevel(logging.DEBUG)
    return EventLog(logger)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(secrets.token_urlsafe(24))
    return path


@pytest.fixture
def sidecar_env(tmp_path: Path, receiver: ReportReceiver, token_file: Path) -> dict[str, str]:
    """The environment the webhook would inject, pointing at the receiver; short intervals."""
    return {
        "POD_NAMESPACE": "team-a",
        "POD_NAME": "trainer-0",
        "POD_UID": str(uuid.uuid4()),
        "SIDECAR_GPU_SHARE": "0.5",
        "SIDECAR_TIMEKEEPER_URL": receiver.url,
        "SIDECAR_TOKEN_FILE": str(token_file),
        "SIDECAR_BUFFER_DIR": str(tmp_path / "buffer"),
        "SIDECAR_REPORT_INTERVAL_SECONDS": "0.3",
        "SIDECAR_SAMPLE_INTERVAL_SECONDS": "0.05",
        "SIDECAR_RETRY_BASE_SECONDS": "0.05",
        "SIDECAR_RETRY_MAX_SECONDS": "0.2",
        "SIDECAR_SHUTDOWN_TIMEOUT_SECONDS": "5",
        "SIDECAR_NVML_BACKEND": "fake",
        "SIDECAR_LOG_FORMAT": "json",
    }


__all__ = ["fake_nvml_library"]
