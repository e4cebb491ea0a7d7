"""Efficiency: allocated GPU-minutes (share x time) beside utilised GPU-minutes (that allocation x the mean
SM utilisation, over the time that had figures), per pod and namespace, exactly; and the idle report
(running pods holding GPUs at least idle_after with utilisation below the threshold), over the API and
as a metric."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi import FastAPI

from tests.support.timekeeper import Api, bearer, ok
from tests.timekeeper.conftest import START
from tests.timekeeper.test_scheduler_jobs import run
from timekeeper.clock import ManualClock

pytestmark = pytest.mark.asyncio(loop_scope="session")


def gpu(util: float | None) -> list[dict[str, Any]]:
    return [{"uuid": "GPU-0", "sm_util_pct": util, "mem_used_bytes": None, "mem_total_bytes": None}]


async def efficiency(api: Api, namespace: str = "team-a", **window: str) -> dict[str, Any]:
    response = await api.client.get(
        f"/namespaces/{namespace}/efficiency", params=window, headers=bearer(api.tokens.reader)
    )
    return dict(ok(response))


async def test_allocated_beside_utilised_per_pod_and_namespace_exactly(api: Api, clock: ManualClock) -> None:
    start = clock.now() - timedelta(minutes=30)
    # Half a GPU for 10 minutes at 50 %: 5 allocated, 2.5 utilised.
    ok(await api.report(pod="a", pod_uid="uid-a", start=start, minutes=10, gpu_share=0.5, gpus=gpu(50.0)))
    # A whole GPU for 3 minutes without figures: allocated, never judged.
    ok(await api.report(pod="b", pod_uid="uid-b", start=start, minutes=3, gpus=gpu(None)))
    # A quarter GPU for 7 minutes at 33.333 %, then 5 more at 0 %: 3 allocated, 0.5833275 utilised.
    ok(await api.report(pod="c", pod_uid="uid-c", start=start, minutes=7, gpu_share=0.25, gpus=gpu(33.333)))
    ok(
        await api.report(
            pod="c",
            pod_uid="uid-c",
            seq=2,
            start=start + timedelta(minutes=7),
            minutes=5,
            gpu_share=0.25,
            gpus=gpu(0.0),
        )
    )

    answer = await efficiency(api)

    assert {pod["pod"]: pod for pod in answer["pods"]} == {
        "a": {
            "pod": "a",
            "allocated_gpu_minutes": 5,
            "measured_gpu_minutes": 5,
            "utilised_gpu_minutes": 2.5,
            "efficiency": 0.5,
        },
        "b": {
            "pod": "b",
            "allocated_gpu_minutes": 3,
            "measured_gpu_minutes": 0,
            "utilised_gpu_minutes": 0,
            "efficiency": None,
        },
        "c": {
            "pod": "c",
            "allocated_gpu_minutes": 3,
            "measured_gpu_minutes": 3,
            "utilised_gpu_minutes": 0.5833275,
            "efficiency": 0.194442500,
        },
    }
    assert (answer["allocated_gpu_minutes"], answer["measured_gpu_minutes"]) == (11, 8)
    assert answer["utilised_gpu_minutes"] == 3.0833275
    assert answer["efficiency"] == 0.385415938  # 3.0833275 / 8, to nine places
    # The allocation is the charge: it equals the usage answer's minutes.
    usage = ok(await api.get("/namespaces/team-a/usage"))
    assert usage["total_gpu_minutes"] == answer["allocated_gpu_minutes"]


async def test_a_window_clips_the_time_and_its_utilisation(api: Api, clock: ManualClock) -> None:
    start = clock.now() - timedelta(minutes=20)
    ok(await api.report(pod="a", pod_uid="uid-a", start=start, minutes=20, gpus=gpu(40.0)))

    answer = await efficiency(
        api,
        since=(start + timedelta(minutes=5)).isoformat(),
        until=(start + timedelta(minutes=8)).isoformat(),
    )

    assert (answer["allocated_gpu_minutes"], answer["utilised_gpu_minutes"]) == (3, 1.2)
    bad = await api.client.get(
        "/namespaces/team-a/efficiency",
        params={"since": START.isoformat(), "until": START.isoformat()},
        headers=bearer(api.tokens.reader),
    )
    assert bad.status_code == 422


async def test_efficiency_is_the_same_after_the_roll_up(api: Api, app: FastAPI, clock: ManualClock) -> None:
    day = datetime(2026, 3, 10, tzinfo=UTC)
    clock.set(day + timedelta(hours=14, minutes=10))
    ok(
        await api.report(
            pod="a",
            pod_uid="uid-a",
            start=day + timedelta(hours=12, minutes=50),
            minutes=20,
            gpu_share=1 / 3,
            gpus=gpu(71.5),
        )
    )
    ok(
        await api.report(
            pod="a",
            pod_uid="uid-a",
            seq=2,
            start=day + timedelta(hours=13, minutes=10),
            minutes=35,
            gpu_share=1 / 3,
            gpus=gpu(12.25),
        )
    )
    window = {"since": "2026-03-10T00:00:00Z", "until": "2026-03-11T00:00:00Z"}
    before = await efficiency(api, **window)
    clock.set(day + timedelta(days=7, hours=14, minutes=9))

    detail = (await run(app, "rollup")).detail
    assert detail["deleted_rows"] == 2  # the raw rows; the hourly aggregates were written at ingest

    assert await efficiency(api, **window) == before
    assert before["utilised_gpu_minutes"] == pytest.approx((20 * 0.715 + 35 * 0.1225) / 3, abs=1e-9)


async def idle(api: Api) -> list[tuple[str, str]]:
    report = ok(await api.client.get("/idle-pods", headers=bearer(api.tokens.reader)))
    return [(pod["namespace"], pod["pod"]) for pod in report["pods"]]


async def test_the_idle_report_names_long_running_pods_using_almost_nothing(
    api: Api, clock: ManualClock
) -> None:
    start = clock.now()
    clock.set(start + timedelta(minutes=70))
    # Every pod reports 70 minutes in 10-minute intervals; the idle threshold is 1 hour below 5 %.
    pods = {
        "idle": [1.0] * 7,
        "busy": [90.0] * 7,
        "woke-up": [0.0] * 6 + [60.0],  # its last hour's mean is 10 %
        "unmeasured": [None] * 7,
        "finished": [0.0] * 7,
    }
    for minute in range(0, 70, 10):
        for name, utils in pods.items():
            ok(
                await api.report(
                    pod=name,
                    pod_uid=f"uid-{name}",
                    seq=minute,
                    start=start + timedelta(minutes=minute),
                    minutes=10,
                    gpus=gpu(utils[minute // 10]),
                    final=name == "finished" and minute == 60,
                )
            )
    ok(
        await api.report(
            namespace="team-b",
            pod="young",
            pod_uid="uid-young",
            start=start + timedelta(minutes=20),
            minutes=50,
            gpus=gpu(0.0),
        )
    )  # idle, but held for under an hour

    assert await idle(api) == [("team-a", "idle")]
    report = ok(await api.client.get("/idle-pods", headers=bearer(api.tokens.reader)))
    [pod] = report["pods"]
    assert (pod["mean_sm_util_pct"], pod["window_gpu_minutes"], pod["held_since"]) == (
        1.0,
        60,
        start.isoformat().replace("+00:00", "Z"),
    )
    assert (report["held_for_seconds"], report["below_sm_util_pct"]) == (3600, 5)

    metrics = (await api.client.get("/metrics")).text
    assert 'timekeeper_idle_gpu_pods{namespace="team-a"} 1.0' in metrics
    assert 'timekeeper_idle_gpus{namespace="team-a"} 1.0' in metrics
    assert 'namespace="team-b"' not in metrics.split("timekeeper_idle_gpu_pods")[1]
