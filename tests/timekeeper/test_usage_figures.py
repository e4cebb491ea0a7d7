"""The measured figures in the usage answers: per pod, hour or day and for the namespace, time-weighted
means (over the time that had the figure), peaks, energy split by time and the GPU statuses seen."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.timekeeper import Api, ok
from timekeeper.clock import ManualClock

pytestmark = pytest.mark.asyncio(loop_scope="session")

NOON = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
WINDOW = {"since": "2026-03-10T00:00:00Z", "until": "2026-03-11T00:00:00Z"}


@pytest.fixture(autouse=True)
def later(clock: ManualClock) -> None:
    clock.set(datetime(2026, 3, 18, 12, tzinfo=UTC))


def gpu(util: float | None, **fields: Any) -> dict[str, Any]:
    return {"uuid": "GPU-0", "sm_util_pct": util, "mem_used_bytes": None, "mem_total_bytes": 1 << 34} | fields


async def usage(api: Api, group_by: str = "pod") -> dict[str, Any]:
    return ok(await api.get("/namespaces/team-a/usage", group_by=group_by, **WINDOW))


def by_key(answer: dict[str, Any], field: str) -> dict[str, Any]:
    return {row["key"]: row[field] for row in answer["rows"]}


async def test_means_are_weighted_by_time_and_count_only_time_with_figures(api: Api) -> None:
    at = NOON
    for seq, (minutes, gpus) in enumerate(
        [
            (10, [gpu(20.0, sm_util_max_pct=35.0, mem_used_bytes=1000, energy_joules=600.0)]),
            (30, [gpu(60.0, sm_util_max_pct=90.0, mem_used_bytes=3000, energy_joules=5400.0)]),
            (20, []),  # the sidecar could read nothing: no figure, no time in the means
            (5, [gpu(None, status="lost")]),
        ],
        start=1,
    ):
        ok(await api.report(pod="a", pod_uid="uid-a", seq=seq, start=at, minutes=minutes, gpus=gpus))
        at += timedelta(minutes=minutes)

    [row] = (answer := await usage(api))["rows"]

    assert row["mean_sm_util_pct"] == (20 * 10 + 60 * 30) / 40
    assert row["peak_sm_util_pct"] == 90.0
    assert row["mean_mem_used_bytes"] == (1000 * 10 + 3000 * 30) / 40
    assert row["peak_mem_used_bytes"] == 3000
    assert row["energy_joules"] == 6000.0
    assert row["gpu_statuses"] == ["lost"]
    assert row["reports"] == 4
    assert {k: answer[f"total_{k}"] for k in ("mean_sm_util_pct", "energy_joules", "gpu_statuses")} == {
        "mean_sm_util_pct": 50.0,
        "energy_joules": 6000.0,
        "gpu_statuses": ["lost"],
    }


async def test_two_time_sliced_pods_on_one_gpu_each_get_their_own_utilisation(api: Api) -> None:
    """The device is 85 % busy; pod a's processes use 25 % of it, pod b's 60 %."""
    for pod, own, memory in (("a", 25.0, 1000), ("b", 60.0, 2000)):
        shared = gpu(
            85.0,
            sm_util_max_pct=99.0,
            mem_used_bytes=3000,
            status="ok",
            pod_sm_util_pct=own,
            pod_sm_util_max_pct=own + 10,
            pod_mem_used_bytes=memory,
            pod_processes=1,
        )
        ok(await api.report(pod=pod, pod_uid=f"uid-{pod}", seq=1, start=NOON, minutes=10, gpus=[shared]))

    answer = await usage(api)

    assert by_key(answer, "mean_sm_util_pct") == {"a": 25.0, "b": 60.0}
    assert by_key(answer, "peak_sm_util_pct") == {"a": 35.0, "b": 70.0}
    assert by_key(answer, "peak_mem_used_bytes") == {"a": 1000, "b": 2000}
    assert by_key(answer, "gpu_statuses") == {"a": ["ok"], "b": ["ok"]}
    assert answer["total_mean_sm_util_pct"] == 42.5
    assert answer["total_peak_sm_util_pct"] == 70.0
    assert answer["total_mean_mem_used_bytes"] == 1500


async def test_a_lost_gpu_shows_its_status_beside_the_ones_that_answered(api: Api) -> None:
    gpus = [gpu(40.0, status="ok"), gpu(None, uuid="GPU-1", status="lost")]
    ok(await api.report(pod="a", pod_uid="uid-a", seq=1, start=NOON, minutes=10, gpus=gpus))
    ok(await api.report(pod="b", pod_uid="uid-b", seq=1, start=NOON, minutes=10, gpus=[gpu(10.0)]))

    answer = await usage(api, "hour")

    assert answer["rows"][0]["gpu_statuses"] == answer["total_gpu_statuses"] == ["ok", "lost"]
    assert answer["rows"][0]["mean_sm_util_pct"] == 25.0


async def test_energy_is_split_across_hours_by_time_and_never_counted_twice(api: Api) -> None:
    at = NOON + timedelta(minutes=50)
    ok(
        await api.report(
            pod="a", pod_uid="uid-a", seq=1, start=at, minutes=20, gpus=[gpu(50.0, energy_joules=1200.0)]
        )
    )
    # Overlaps the first report's last 10 minutes: only its 10 new minutes (and their energy) count.
    ok(
        await api.report(
            pod="a",
            pod_uid="uid-a",
            seq=2,
            start=at + timedelta(minutes=10),
            minutes=20,
            gpus=[gpu(90.0, energy_joules=2400.0)],
        )
    )

    answer = await usage(api, "hour")

    assert by_key(answer, "energy_joules") == {"2026-03-10T12:00:00Z": 600.0, "2026-03-10T13:00:00Z": 1800.0}
    # 13:00-13:10 at 50 %, 13:10-13:20 at 90 %: the overlap is measured once, by the report charged for it.
    assert by_key(answer, "mean_sm_util_pct") == {"2026-03-10T12:00:00Z": 50.0, "2026-03-10T13:00:00Z": 70.0}
    assert answer["total_energy_joules"] == 2400.0


async def test_usage_without_figures_answers_none(api: Api) -> None:
    ok(await api.report(pod="a", pod_uid="uid-a", seq=1, start=NOON, minutes=10, gpus=[]))

    answer = await usage(api)

    assert answer["rows"][0] | {"gpu_minutes": None, "raw_gpu_minutes": None} == {
        "key": "a",
        "gpu_minutes": None,
        "raw_gpu_minutes": None,
        "reports": 1,
        "mean_sm_util_pct": None,
        "peak_sm_util_pct": None,
        "mean_mem_used_bytes": None,
        "peak_mem_used_bytes": None,
        "energy_joules": None,
        "gpu_statuses": [],
    }
    assert answer["total_mean_sm_util_pct"] is None and answer["total_gpu_statuses"] == []
