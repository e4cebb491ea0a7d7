"""Where the minutes went: usage by pod, hour or day, exact to the charged time inside the window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.support.timekeeper import Api, ok
from timekeeper.clock import ManualClock

pytestmark = pytest.mark.asyncio(loop_scope="session")

NOON = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def later(clock: ManualClock) -> None:
    clock.set(datetime(2026, 3, 18, 12, tzinfo=UTC))


async def usage(api: Api, **params: str) -> dict:
    return ok(await api.get("/namespaces/team-a/usage", **params))


async def test_usage_by_pod(api: Api) -> None:
    ok(await api.report(pod="a", pod_uid="uid-a", seq=1, start=NOON, minutes=10, gpu_share=1))
    ok(await api.report(pod="b", pod_uid="uid-b", seq=1, start=NOON, minutes=10, gpu_share=0.5))
    ok(
        await api.report(
            pod="b", pod_uid="uid-b", seq=2, start=NOON + timedelta(minutes=10), minutes=10, gpu_share=0.5
        )
    )
    ok(await api.report(namespace="team-b", pod="c", pod_uid="uid-c", seq=1, start=NOON, minutes=10))

    answer = await usage(api, group_by="pod")

    assert [(row["key"], row["gpu_minutes"], row["reports"]) for row in answer["rows"]] == [
        ("a", 10, 1),
        ("b", 10, 2),
    ]
    assert answer["total_gpu_minutes"] == 20
    assert answer["since"] == "2026-03-01T00:00:00Z"  # the current (default: monthly) period


async def test_usage_by_hour_splits_an_interval_across_hours(api: Api) -> None:
    ok(await api.report(seq=1, start=NOON - timedelta(minutes=20), minutes=50, gpu_share=2))

    answer = await usage(api, group_by="hour")

    assert [(row["key"], row["gpu_minutes"]) for row in answer["rows"]] == [
        ("2026-03-10T11:00:00Z", 40),
        ("2026-03-10T12:00:00Z", 60),
    ]


async def test_usage_by_day_counts_only_time_inside_the_window(api: Api) -> None:
    midnight = datetime(2026, 3, 11, tzinfo=UTC)
    ok(await api.report(seq=1, start=midnight - timedelta(minutes=30), minutes=60))

    answer = await usage(api, group_by="day", since="2026-03-10T23:50:00Z", until="2026-03-11T00:10:00Z")

    assert [(row["key"], row["gpu_minutes"]) for row in answer["rows"]] == [
        ("2026-03-10", 10),
        ("2026-03-11", 10),
    ]
    assert answer["total_gpu_minutes"] == 20


async def test_usage_reports_only_what_was_charged(api: Api) -> None:
    ok(await api.report(seq=1, start=NOON, minutes=10))
    ok(await api.report(seq=1, start=NOON, minutes=10))  # a retry
    ok(await api.report(seq=2, start=NOON + timedelta(minutes=5), minutes=10))  # half overlapping

    answer = await usage(api, group_by="pod")

    assert answer["total_gpu_minutes"] == 15
    assert answer["total_gpu_minutes"] == (await api.budget("team-a"))["used_gpu_minutes"]


async def test_usage_of_an_idle_namespace_is_empty(api: Api) -> None:
    answer = await usage(api)

    assert (answer["rows"], answer["total_gpu_minutes"]) == ([], 0)
