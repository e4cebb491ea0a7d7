"""Budgets: state from budget, grants and use; the default for namespaces without their own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuaccounting.admission_state import default_priority_policy
from tests.support.timekeeper import Api, ok
from tests.timekeeper.conftest import START
from timekeeper.clock import ManualClock

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Pod:
    """A pod that reports consecutive intervals ending at the clock's now, like its sidecar would."""

    def __init__(self, api: Api, clock: ManualClock, namespace: str = "team-a", share: float = 1.0) -> None:
        self.api, self.clock, self.namespace, self.share = api, clock, namespace, share
        self.seq = 0

    async def runs(self, minutes: float) -> dict:
        self.seq += 1
        start = self.clock.now()
        self.clock.advance(timedelta(minutes=minutes))
        return ok(
            await self.api.report(
                namespace=self.namespace,
                pod_uid=f"uid-{self.namespace}",
                seq=self.seq,
                start=start,
                minutes=minutes,
                gpu_share=self.share,
            )
        )


async def test_budget_to_warning_to_exhausted_and_back_with_a_grant(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=100, warn_at_fraction=0.8))
    pod = Pod(api, clock, share=2)

    assert (await pod.runs(30))["state"] == "in_budget"  # 60 used
    assert (await pod.runs(10))["state"] == "warning"  # 80 used: 80 % of 100
    assert (await pod.runs(10))["state"] == "exhausted"  # 100 used, nothing left

    status = await api.budget("team-a")
    assert status["remaining_gpu_minutes"] == 0
    assert status["priority_class"] == "gpu-over-budget"

    grant = ok(await api.grant("team-a", 50, reason="paper deadline"))
    assert grant["budget"]["state"] == "in_budget"  # 100 of 150: below 80 % (120)
    status = await api.budget("team-a")
    assert (status["granted_gpu_minutes"], status["remaining_gpu_minutes"]) == (50, 50)
    assert status["priority_class"] == "gpu-in-budget"
    assert (await pod.runs(10))["state"] == "warning"  # 120 of 150


async def test_exceeding_the_budget_is_charged_in_full(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=10))
    pod = Pod(api, clock)

    ack = await pod.runs(25)

    assert ack["gpu_minutes"] == 25
    assert (await api.budget("team-a"))["remaining_gpu_minutes"] == -15


async def test_a_namespace_without_a_budget_of_its_own_follows_the_default(
    api: Api, clock: ManualClock
) -> None:
    ok(await api.put_defaults(budget_gpu_minutes=20, period="weekly"))
    ok(await api.put_budget("team-b", budget_gpu_minutes=1000, period="monthly"))
    await Pod(api, clock, "team-a").runs(20)
    await Pod(api, clock, "team-b").runs(20)

    team_a, team_b = await api.budget("team-a"), await api.budget("team-b")

    assert (team_a["source"], team_a["budget_gpu_minutes"], team_a["state"]) == ("default", 20, "exhausted")
    assert team_a["period"] == {
        "kind": "weekly",
        "start": "2026-03-16T00:00:00Z",
        "end": "2026-03-23T00:00:00Z",
    }
    assert (team_b["source"], team_b["budget_gpu_minutes"], team_b["state"]) == (
        "namespace",
        1000,
        "in_budget",
    )


async def test_deleting_a_budget_returns_the_namespace_to_the_default(api: Api, clock: ManualClock) -> None:
    ok(await api.put_defaults(budget_gpu_minutes=5))
    ok(await api.put_budget("team-a", budget_gpu_minutes=100))
    await Pod(api, clock).runs(10)
    assert (await api.budget("team-a"))["state"] == "in_budget"

    after = ok(await api.delete_budget("team-a"))

    assert (after["source"], after["state"], after["used_gpu_minutes"]) == ("default", "exhausted", 10)
    assert (await api.delete_budget("team-a")).status_code == 404


async def test_without_any_budget_a_namespace_is_unlimited(api: Api, clock: ManualClock) -> None:
    await Pod(api, clock, share=100).runs(60)

    status = await api.budget("team-a")

    assert (status["state"], status["budget_gpu_minutes"], status["remaining_gpu_minutes"]) == (
        "unlimited",
        None,
        None,
    )
    assert status["priority_class"] == "gpu-in-budget"


async def test_a_namespace_never_seen_answers_with_the_default_and_nothing_used(api: Api) -> None:
    ok(await api.put_defaults(budget_gpu_minutes=42, period="daily"))

    status = await api.budget("brand-new")

    assert (status["source"], status["budget_gpu_minutes"], status["used_gpu_minutes"]) == ("default", 42, 0)
    assert status["state"] == "in_budget"
    assert status["period"]["start"] == "2026-03-18T00:00:00Z"


async def test_a_new_period_starts_from_zero(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=10, period="daily"))
    await Pod(api, clock).runs(10)
    assert (await api.budget("team-a"))["state"] == "exhausted"

    clock.set(datetime(2026, 3, 19, 0, 0, 1, tzinfo=UTC))

    status = await api.budget("team-a")
    assert (status["used_gpu_minutes"], status["state"]) == (0, "in_budget")


async def test_a_grant_counts_for_the_current_period_only(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=10, period="daily"))
    ok(await api.grant("team-a", 5))
    assert (await api.budget("team-a"))["granted_gpu_minutes"] == 5

    clock.set(datetime(2026, 3, 19, 9, tzinfo=UTC))

    assert (await api.budget("team-a"))["granted_gpu_minutes"] == 0


async def test_changing_the_period_recounts_this_periods_use_from_the_ledger(
    api: Api, clock: ManualClock
) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=1000, period="monthly"))
    pod = Pod(api, clock)
    clock.set(START - timedelta(days=1))
    await pod.runs(30)  # yesterday: this month and this week, not today
    clock.set(START - timedelta(hours=1))
    await pod.runs(20)  # today
    ok(await api.grant("team-a", 7))

    daily = ok(await api.put_budget("team-a", budget_gpu_minutes=1000, period="daily"))
    weekly = ok(await api.put_budget("team-a", budget_gpu_minutes=1000, period="weekly"))
    monthly = ok(await api.put_budget("team-a", budget_gpu_minutes=1000, period="monthly"))

    assert (daily["used_gpu_minutes"], weekly["used_gpu_minutes"], monthly["used_gpu_minutes"]) == (
        20,
        50,
        50,
    )
    assert daily["granted_gpu_minutes"] == weekly["granted_gpu_minutes"] == 7


async def test_the_none_period_is_one_open_ended_period(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=100, period="none"))
    pod = Pod(api, clock)
    await pod.runs(30)
    clock.advance(timedelta(days=400))
    await pod.runs(30)

    status = await api.budget("team-a")

    assert status["period"] == {"kind": "none", "start": None, "end": None}
    assert status["used_gpu_minutes"] == 60


async def test_the_namespace_list_shows_every_known_namespace(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-c", budget_gpu_minutes=1))
    await Pod(api, clock, "team-a").runs(1)
    await Pod(api, clock, "team-b").runs(1)
    ok(await api.grant("team-d", 3))

    listed = ok(await api.get("/namespaces"))

    assert [entry["namespace"] for entry in listed] == ["team-a", "team-b", "team-c", "team-d"]
    assert [entry["used_gpu_minutes"] for entry in listed] == [1, 1, 0, 0]


async def test_defaults_read_back_as_written(api: Api) -> None:
    written = ok(
        await api.put_defaults(
            budget_gpu_minutes=12.5, period="daily", warn_at_fraction=0.5, max_gpu_share_per_pod=2
        )
    )

    assert (
        ok(await api.get("/defaults"))
        == written
        == {
            "budget_gpu_minutes": 12.5,
            "period": "daily",
            "warn_at_fraction": 0.5,
            "max_gpu_share_per_pod": 2.0,
            "concurrent_gpu_limit": None,
            "priority_policy": default_priority_policy(),
            "running_pod_action": "none",
            "models": {},
            "model_policy": "reduce",
        }
    )
