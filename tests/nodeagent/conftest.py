"""Fixtures for the node agent's tests: the fake NVML library and a report receiver."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.sidecar.receiver import ReportReceiver
from tests.support.fakenvml.fixtures import fake_nvml_library


@pytest.fixture
def receiver() -> Iterator[ReportReceiver]:
    running = ReportReceiver().start()
    yield running
    running.stop()


__all__ = ["fake_nvml_library"]
