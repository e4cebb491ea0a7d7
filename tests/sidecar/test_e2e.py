"""End to end: the real sidecar process reporting to the real timekeeper process on PostgreSQL, through a
timekeeper outage and restart, a kill -9 and restart of the sidecar, and SIGTERM. The namespace is then
charged exactly share x the wall time the sidecar's own persisted state says it covered: nothing lost,
nothing twice."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import URL

from tests.sidecar.coverage import persisted_state
from tests.support.processes import SidecarProcess, TimekeeperProcess, free_port, wait_until
from tests.support.timekeeper import Tokens, bearer, migrated_database

pytestmark = pytest.mark.e2e

NAMESPACE = "team-e2e"
SHARE = Decimal("0.375")
# The ledger keeps nano-GPU-minutes, each report rounded half-up: at most half a nano-minute per report.
NANO = Decimal("0.000000001")


@pytest.fixture
def database() -> Iterator[URL]:
    with migrated_database("gtk_sidecar_e2e") as url:
        yield url


@pytest.fixture
def tokens() -> Tokens:
    return Tokens()


@pytest.fixture
def timekeeper(database: URL, tokens: Tokens, tmp_path: Path) -> Iterator[TimekeeperProcess]:
    running = TimekeeperProcess(database, tokens.env(), free_port(), tmp_path / "timekeeper.log")
    running.start()
    yield running
    running.stop()


def budget(timekeeper: TimekeeperProcess, tokens: Tokens) -> dict[str, Any]:
    response = httpx.get(
        f"{timekeeper.url}/api/v1/namespaces/{NAMESPACE}/budget", headers=bearer(tokens.reader), timeout=5
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_the_namespace_is_charged_exactly_share_times_wall_time(
    timekeeper: TimekeeperProcess, tokens: Tokens, tmp_path: Path
) -> None:
    put = httpx.put(
        f"{timekeeper.url}/api/v1/namespaces/{NAMESPACE}/budget",
        json={"budget_gpu_minutes": 100000, "period": "monthly"},
        headers=bearer(tokens.admin),
        timeout=5,
    )
    assert put.status_code == 200, put.text
    token_file = tmp_path / "token"
    token_file.write_text(tokens.reporter)
    buffer_dir = tmp_path / "buffer"
    env = {
        "POD_NAMESPACE": NAMESPACE,
        "POD_NAME": "trainer-0",
        "POD_UID": str(uuid.uuid4()),
        "SIDECAR_GPU_SHARE": str(SHARE),
        "SIDECAR_TIMEKEEPER_URL": timekeeper.url,
        "SIDECAR_TOKEN_FILE": str(token_file),
        "SIDECAR_BUFFER_DIR": str(buffer_dir),
        "SIDECAR_REPORT_INTERVAL_SECONDS": "0.5",
        "SIDECAR_SAMPLE_INTERVAL_SECONDS": "0.1",
        "SIDECAR_RETRY_BASE_SECONDS": "0.1",
        "SIDECAR_RETRY_MAX_SECONDS": "0.5",
        "SIDECAR_SHUTDOWN_TIMEOUT_SECONDS": "10",
        "SIDECAR_NVML_BACKEND": "fake",
    }

    def used() -> Decimal:
        return Decimal(str(budget(timekeeper, tokens)["used_gpu_minutes"]))

    first = SidecarProcess(env, tmp_path / "sidecar-1.log")
    wait_until(lambda: used() > 0, what="the first charge")

    timekeeper.stop()  # an outage: the sidecar buffers
    wait_until(lambda: "timekeeper_unreachable" in first.event_names(), what="the sidecar to notice")
    time.sleep(1.5)
    timekeeper.start()
    wait_until(lambda: "timekeeper_reachable" in first.event_names(), what="the buffer to drain")

    first.kill()  # no flush, no final report
    time.sleep(1.0)  # the pod keeps its GPU while its sidecar is down
    charged_before_restart = used()
    second = SidecarProcess(env, tmp_path / "sidecar-2.log")
    wait_until(lambda: used() > charged_before_restart, what="charges after the restart")
    time.sleep(1.0)

    assert second.terminate() == 0

    state = persisted_state(buffer_dir)
    wall_microseconds = state["covered_until_us"] - state["anchor_us"]
    expected = SHARE * wall_microseconds / Decimal(60_000_000)
    reports = state["next_seq"] - 1
    assert state["dropped_reports"] == 0
    assert list((buffer_dir / "pending").iterdir()) == []
    assert "sidecar_stopped" in second.event_names()
    assert abs(used() - expected) <= reports * NANO / 2, (used(), expected)
    assert wall_microseconds > 5_000_000  # the run spanned the outage and the restart
