"""The sidecar as the pod runs it: contiguous numbered intervals from its first start, a final report on
SIGTERM, nothing lost or repeated across a kill -9 and restart or a timekeeper outage, exit code 0."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpuaccounting.clock import from_datetime
from sidecar.app import grid_floor
from tests.sidecar.coverage import bounds, persisted_state, union
from tests.sidecar.receiver import ReportReceiver
from tests.support.processes import SidecarProcess, wait_until


def assert_exact_cover(reports: list[dict[str, Any]], buffer_dir: Path) -> None:
    """The reports cover [first start, last end) exactly: no gap, no overlap, no seq used twice."""
    state = persisted_state(buffer_dir)
    ordered = sorted(reports, key=lambda r: bounds(r)[0])
    assert union(ordered) == [(state["anchor_us"], state["covered_until_us"])]
    assert all(bounds(a)[1] == bounds(b)[0] for a, b in itertools.pairwise(ordered))
    assert len({r["seq"] for r in reports}) == len(reports)


def test_intervals_are_contiguous_on_the_grid_and_sigterm_sends_a_final_one(
    tmp_path: Path, receiver: ReportReceiver, sidecar_env: dict[str, str]
) -> None:
    sidecar = SidecarProcess({**sidecar_env, "SIDECAR_LOG_DEBUG": "true"}, tmp_path / "sidecar.log")
    wait_until(lambda: len(receiver.accepted()) >= 3, what="three reports")

    assert sidecar.terminate() == 0

    reports = receiver.accepted()
    buffer_dir = Path(sidecar_env["SIDECAR_BUFFER_DIR"])
    assert_exact_cover(reports, buffer_dir)
    anchor = persisted_state(buffer_dir)["anchor_us"]
    *regular, last = sorted(reports, key=lambda r: r["seq"])
    assert last["final"] is True and not any(r["final"] for r in regular)
    assert all(bounds(r)[1] == grid_floor(anchor, 300_000, bounds(r)[1]) for r in regular)
    assert {r["namespace"] for r in reports} == {"team-a"}
    assert {r["gpu_share"] for r in reports} == {0.5}
    assert all(r["gpus"] and r["gpus"][0]["sm_util_pct"] is not None for r in regular)
    assert sidecar.event_names()[-1] == "sidecar_stopped"
    cuts = [e for e in sidecar.events() if e["event"] == "interval_cut"]
    gpu = regular[0]["gpus"][0]["uuid"]
    assert cuts[0]["max_compute_processes"] == {gpu: 1}
    assert {e["namespace"] for e in sidecar.events()} == {"team-a"}


def test_kill_and_restart_resume_the_numbering_and_report_the_downtime(
    tmp_path: Path, receiver: ReportReceiver, sidecar_env: dict[str, str]
) -> None:
    sidecar_env = {**sidecar_env, "SIDECAR_MAX_REPORT_INTERVAL_SECONDS": "0.5"}
    first = SidecarProcess(sidecar_env, tmp_path / "first.log")
    wait_until(lambda: len(receiver.accepted()) >= 2, what="reports before the kill")
    first.kill()
    killed_at = persisted_state(Path(sidecar_env["SIDECAR_BUFFER_DIR"]))["covered_until_us"]
    seqs_before = {r["seq"] for r in receiver.accepted()}
    time.sleep(1.5)  # down for longer than the longest interval the timekeeper takes

    second = SidecarProcess(sidecar_env, tmp_path / "second.log")
    wait_until(lambda: len(receiver.accepted()) >= len(seqs_before) + 2, what="reports after the restart")
    assert second.terminate() == 0

    reports = receiver.accepted()
    assert_exact_cover(reports, Path(sidecar_env["SIDECAR_BUFFER_DIR"]))
    after = [r for r in reports if r["seq"] not in seqs_before]
    assert min(r["seq"] for r in after) > max(seqs_before)
    assert min(bounds(r)[0] for r in after) <= killed_at
    # The downtime went out in pieces the timekeeper accepts, without figures (nothing was sampled).
    assert all(bounds(r)[1] - bounds(r)[0] <= 500_000 for r in reports)
    assert any(r["gpus"] == [] for r in after)
    started = next(e for e in second.events() if e["event"] == "sidecar_started")
    assert started["resumed"] is True


def test_a_timekeeper_outage_is_buffered_and_folded_without_losing_time(
    tmp_path: Path, receiver: ReportReceiver, sidecar_env: dict[str, str]
) -> None:
    receiver.script.extend([503] * 25)
    env = {**sidecar_env, "SIDECAR_BUFFER_MAX_REPORTS": "3", "SIDECAR_REPORT_INTERVAL_SECONDS": "0.2"}
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    wait_until(lambda: "buffer_folded" in sidecar.event_names(), what="a fold during the outage")
    wait_until(lambda: len(receiver.accepted()) >= 3, what="delivery after the outage")

    assert sidecar.terminate() == 0

    buffer_dir = Path(env["SIDECAR_BUFFER_DIR"])
    state = persisted_state(buffer_dir)
    # Folding may resend time a report in flight already delivered; the union is what gets charged.
    assert union(receiver.accepted()) == [(state["anchor_us"], state["covered_until_us"])]
    assert state["dropped_reports"] == 0
    names = sidecar.event_names()
    assert names.count("timekeeper_unreachable") == 1 and names.count("timekeeper_reachable") == 1


def test_bad_configuration_is_logged_and_exits_zero(tmp_path: Path, sidecar_env: dict[str, str]) -> None:
    env = {**sidecar_env, "SIDECAR_GPU_SHARE": "lots"}
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")

    assert sidecar.process.wait(timeout=20) == 0
    (event,) = sidecar.events()
    assert event["event"] == "config_invalid"
    assert "SIDECAR_GPU_SHARE" in event["detail"]


def test_on_an_accelerated_clock_a_restarted_sidecar_resumes_on_the_same_simulated_timeline(
    tmp_path: Path, receiver: ReportReceiver, sidecar_env: dict[str, str]
) -> None:
    """The clock's origin is given, not taken from the process's start, so a sidecar killed and restarted
    continues where the simulated time is, covering its downtime in simulated time, with no gap or jump."""
    start = datetime(2026, 3, 1, tzinfo=UTC)
    speed = 3600.0
    origin = time.time()
    env = {
        **sidecar_env,
        "SIDECAR_CLOCK_START": "2026-03-01T00:00:00Z",
        "SIDECAR_CLOCK_SPEED": str(speed),
        "SIDECAR_CLOCK_ORIGIN": repr(origin),
        "SIDECAR_REPORT_INTERVAL_SECONDS": "600",  # simulated: 1/6 of a real second
    }
    first = SidecarProcess(env, tmp_path / "first.log")
    wait_until(lambda: len(receiver.accepted()) >= 2, what="reports before the kill")
    first.kill()
    before = len(receiver.accepted())
    time.sleep(0.5)  # half a simulated hour down
    second = SidecarProcess(env, tmp_path / "second.log")
    wait_until(lambda: len(receiver.accepted()) >= before + 2, what="reports after the restart")
    assert second.terminate() == 0
    finished = time.time()

    reports = receiver.accepted()
    buffer_dir = Path(env["SIDECAR_BUFFER_DIR"])
    assert_exact_cover(reports, buffer_dir)
    state = persisted_state(buffer_dir)
    # Every interval lies between the clock's start and what it read when the test finished: March 2026,
    # not today's real date.
    assert from_datetime(start) <= state["anchor_us"]
    assert state["covered_until_us"] <= from_datetime(start + timedelta(seconds=(finished - origin) * speed))
    *regular, _final = sorted(reports, key=lambda r: r["seq"])
    on_grid = [
        r for r in regular if bounds(r)[1] == grid_floor(state["anchor_us"], 600_000_000, bounds(r)[1])
    ]
    assert len(on_grid) >= 3  # regular cuts land on the simulated 10-minute grid
    started = next(e for e in second.events() if e["event"] == "sidecar_started")
    assert started["resumed"] is True and started["clock_speed"] == speed
