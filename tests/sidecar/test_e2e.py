"""End to end: the real sidecar process reporting to the real timekeeper process on PostgreSQL, through a
timekeeper outage and restart, a kill -9 and restart of the sidecar, and SIGTERM. The namespace is then
charged exactly share x the wall time the sidecar's own persisted state says it covered: nothing lost,
nothing twice."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import URL

from gpuaccounting.clock import from_datetime, to_datetime
from gpuaccounting.wire import format_timestamp
from tests.sidecar.coverage import persisted_state
from tests.support.processes import LOCAL_HTTP, SidecarProcess, TimekeeperProcess, free_port, wait_until
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
    response = LOCAL_HTTP.get(
        f"{timekeeper.url}/api/v1/namespaces/{NAMESPACE}/budget", headers=bearer(tokens.reader), timeout=5
    )
    assert response.status_code == 200, response.text
    return response.json()


def prepare_pod(
    timekeeper: TimekeeperProcess, tokens: Tokens, tmp_path: Path, period: str = "none", **env: str
) -> dict[str, str]:
    """A namespace with a large budget and one pod's sidecar env (token file, buffer dir) reporting to it.
    The budget has no period unless asked: a monthly one on the system clock would count only the new
    month's part of a run that crosses midnight on the 1st, and the charge would no longer match."""
    put_budget(timekeeper, tokens, period)
    return pod_env(timekeeper, tokens, tmp_path, **env)


def put_budget(timekeeper: TimekeeperProcess, tokens: Tokens, period: str) -> None:
    put = LOCAL_HTTP.put(
        f"{timekeeper.url}/api/v1/namespaces/{NAMESPACE}/budget",
        json={"budget_gpu_minutes": 100000, "period": period},
        headers=bearer(tokens.admin),
        timeout=5,
    )
    assert put.status_code == 200, put.text


def pod_env(timekeeper: TimekeeperProcess, tokens: Tokens, tmp_path: Path, **env: str) -> dict[str, str]:
    token_file = tmp_path / "token"
    token_file.write_text(tokens.reporter)
    return {
        "POD_NAMESPACE": NAMESPACE,
        "POD_NAME": "trainer-0",
        "POD_UID": str(uuid.uuid4()),
        "SIDECAR_GPU_SHARE": str(SHARE),
        "SIDECAR_TIMEKEEPER_URL": timekeeper.url,
        "SIDECAR_TOKEN_FILE": str(token_file),
        "SIDECAR_BUFFER_DIR": str(tmp_path / "buffer"),
        "SIDECAR_SAMPLE_INTERVAL_SECONDS": "0.1",
        "SIDECAR_NVML_BACKEND": "fake",
        **env,
    }


def test_the_namespace_is_charged_exactly_share_times_wall_time(
    timekeeper: TimekeeperProcess, tokens: Tokens, tmp_path: Path
) -> None:
    env = prepare_pod(
        timekeeper,
        tokens,
        tmp_path,
        SIDECAR_REPORT_INTERVAL_SECONDS="0.5",
        SIDECAR_RETRY_BASE_SECONDS="0.1",
        SIDECAR_RETRY_MAX_SECONDS="0.5",
        SIDECAR_SHUTDOWN_TIMEOUT_SECONDS="10",
    )
    buffer_dir = Path(env["SIDECAR_BUFFER_DIR"])

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


def test_under_an_accelerated_clock_intervals_are_stamped_and_charged_in_simulated_time(
    database: URL, tokens: Tokens, tmp_path: Path
) -> None:
    """The timekeeper and the sidecar share start, speed and origin (one hour per real second, starting
    ten hours before a month ends; the sidecar starts beside the timekeeper, and only its own start must
    come before the month ends): the sidecar's intervals lie
    in simulated January and February, the timekeeper accepts them as not in the future, splits them at
    the month boundary and charges share x the simulated time covered."""
    start = datetime(2026, 1, 31, 14, 0, tzinfo=UTC)
    february = datetime(2026, 2, 1, tzinfo=UTC)
    speed = 3600.0
    origin = time.time()
    clock = {"CLOCK_START": format_timestamp(start), "CLOCK_SPEED": str(speed), "CLOCK_ORIGIN": repr(origin)}
    timekeeper = TimekeeperProcess(
        database,
        {
            **tokens.env(),
            **{f"TIMEKEEPER_{name}": value for name, value in clock.items()},
            # Three report intervals of simulated time: a sidecar's clock disagreeing by more is refused.
            "TIMEKEEPER_CLOCK_SKEW": "1800",
        },
        free_port(),
        tmp_path / "timekeeper.log",
    )
    env = pod_env(
        timekeeper,
        tokens,
        tmp_path,
        SIDECAR_REPORT_INTERVAL_SECONDS="600",  # simulated: a sixth of a real second
        # Real seconds: the reports made before the timekeeper answers are delivered soon after it does.
        SIDECAR_RETRY_BASE_SECONDS="0.1",
        SIDECAR_RETRY_MAX_SECONDS="0.5",
        **{f"SIDECAR_{name}": value for name, value in clock.items()},
    )
    buffer_dir = Path(env["SIDECAR_BUFFER_DIR"])
    launched = time.time()
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    try:
        timekeeper.start()
        put_budget(timekeeper, tokens, "monthly")  # on the simulated clock, whose month ends during the test
        wait_until(lambda: "sidecar_started" in sidecar.event_names(), what="the sidecar to start")
        started = time.time()
        wait_until(
            lambda: (
                budget(timekeeper, tokens)["period"]["start"].startswith("2026-02-01")
                and budget(timekeeper, tokens)["used_gpu_minutes"] > 0
            ),
            timeout=60,  # February begins ten real seconds after the origin
            what="charges in the simulated February",
        )
        assert sidecar.terminate() == 0

        state = persisted_state(buffer_dir)
        anchor, covered_until = to_datetime(state["anchor_us"]), to_datetime(state["covered_until_us"])
        # The anchor is the simulated time at the sidecar's start, not the real time.
        assert start + timedelta(seconds=(launched - origin) * speed) <= anchor
        assert anchor <= start + timedelta(seconds=(started - origin) * speed)
        assert anchor < february < covered_until
        assert state["dropped_reports"] == 0
        assert "sidecar_stopped" in sidecar.event_names()

        reports = state["next_seq"] - 1
        simulated = Decimal(state["covered_until_us"] - state["anchor_us"])
        usage = LOCAL_HTTP.get(
            f"{timekeeper.url}/api/v1/namespaces/{NAMESPACE}/usage",
            params={"since": format_timestamp(start), "until": format_timestamp(covered_until)},
            headers=bearer(tokens.reader),
            timeout=5,
        )
        assert usage.status_code == 200, usage.text
        total = Decimal(str(usage.json()["total_gpu_minutes"]))
        assert abs(total - SHARE * simulated / Decimal(60_000_000)) <= reports * NANO, total
        # February's period holds only the part after midnight: the reports were split at the boundary.
        in_february = Decimal(from_datetime(covered_until) - from_datetime(february))
        used = Decimal(str(budget(timekeeper, tokens)["used_gpu_minutes"]))
        assert abs(used - SHARE * in_february / Decimal(60_000_000)) <= reports * NANO, used
    finally:
        if sidecar.process.poll() is None:
            sidecar.kill()
        timekeeper.stop()
