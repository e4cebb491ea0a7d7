"""The forecast: the burn rate over the recent window and when, at that rate, the budget (grants
included) runs out within the period; in the budget answers and as metrics."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.support.timekeeper import Api, ok
from tests.timekeeper.conftest import START
from tests.timekeeper.test_health import root_client, samples
from tests.timekeeper.test_scheduler_jobs import run
from timekeeper.app import current, expose
from timekeeper.budgets.burn import attribute
from timekeeper.budgets.forecast import forecast
from timekeeper.clock import ManualClock

SIX_HOURS = timedelta(hours=6)
NOW = START
MONTH_END = datetime(2026, 4, 1, tzinfo=UTC)


# The rule on its own.


def test_a_steady_burn_runs_out_when_the_remainder_is_spent_at_that_rate() -> None:
    # 120 GPU-minutes in six hours: 20 an hour; 100 left last five more hours.
    outlook = forecast(NOW, SIX_HOURS, Decimal(120), Decimal(100), MONTH_END)

    assert outlook.window_minutes == 360
    assert outlook.burn_rate_gpu_minutes_per_hour == 20
    assert outlook.exhausts_at == NOW + timedelta(hours=5)


def test_a_grant_moves_the_exhaustion_later() -> None:
    before = forecast(NOW, SIX_HOURS, Decimal(120), Decimal(100), MONTH_END)
    after = forecast(NOW, SIX_HOURS, Decimal(120), Decimal(100 + 40), MONTH_END)

    assert after.exhausts_at == before.exhausts_at + timedelta(hours=2)  # type: ignore[operator]


def test_no_burn_forecasts_no_exhaustion() -> None:
    outlook = forecast(NOW, SIX_HOURS, Decimal(0), Decimal(100), MONTH_END)

    assert (outlook.burn_rate_gpu_minutes_per_hour, outlook.exhausts_at) == (0, None)


def test_a_period_that_ends_first_forecasts_no_exhaustion() -> None:
    # Five hours of budget left at this rate, but the period (and with it the budget) renews in four.
    assert forecast(NOW, SIX_HOURS, Decimal(120), Decimal(100), NOW + timedelta(hours=4)).exhausts_at is None
    assert forecast(NOW, SIX_HOURS, Decimal(120), Decimal(100), NOW + timedelta(hours=6)).exhausts_at == (
        NOW + timedelta(hours=5)
    )


def test_an_open_ended_period_runs_out_however_far_away() -> None:
    outlook = forecast(NOW, SIX_HOURS, Decimal(6), Decimal(1_000_000), None)

    assert outlook.exhausts_at == NOW + timedelta(hours=1_000_000)


def test_a_remainder_that_would_last_millennia_is_no_forecast() -> None:
    # A budget of a trillion GPU-minutes burnt at one an hour would last past any time the API answers.
    assert forecast(NOW, SIX_HOURS, Decimal(6), Decimal("1e12"), None).exhausts_at is None


def test_an_unlimited_budget_never_runs_out() -> None:
    outlook = forecast(NOW, SIX_HOURS, Decimal(120), None, MONTH_END)

    assert (outlook.burn_rate_gpu_minutes_per_hour, outlook.exhausts_at) == (20, None)


@pytest.mark.parametrize("remaining", [Decimal(0), Decimal(-15)])
def test_a_namespace_already_exhausted_is_not_forecast_again(remaining: Decimal) -> None:
    # Its state says `exhausted`; the forecast keeps the rate and forecasts nothing further.
    outlook = forecast(NOW, SIX_HOURS, Decimal(120), remaining, MONTH_END)

    assert (outlook.burn_rate_gpu_minutes_per_hour, outlook.exhausts_at) == (20, None)


# The burn buckets on their own: a charge goes to the 5-minute buckets its time overlaps, in proportion.


def test_a_charge_straddling_a_bucket_boundary_is_split_by_time_and_sums_exactly() -> None:
    t = NOW + timedelta(minutes=3)  # 12:03-12:08: two minutes before 12:05, three after
    assert attribute([("team-a", Decimal("1.5"), [(t, t + timedelta(minutes=5))])]) == {
        ("team-a", NOW): Decimal("0.6"),
        ("team-a", NOW + timedelta(minutes=5)): Decimal("0.9"),
    }
    # Thirds round at the ledger's scale; the last bucket takes the remainder, so nothing is lost.
    t = NOW + timedelta(minutes=4)
    split = attribute([("team-a", Decimal(1), [(t, t + timedelta(seconds=90))])])
    assert split == {
        ("team-a", NOW): Decimal("0.666666667"),
        ("team-a", t + timedelta(minutes=1)): Decimal("0.333333333"),
    }
    assert sum(split.values()) == 1


def test_charges_of_one_bucket_add_up_and_a_zero_charge_burns_nothing() -> None:
    t = NOW + timedelta(minutes=1)
    pieces = [(t, t + timedelta(minutes=1)), (t + timedelta(minutes=2), t + timedelta(minutes=3))]
    assert attribute(
        [("a", Decimal(2), pieces), ("a", Decimal(1), pieces[:1]), ("b", Decimal(0), pieces)]
    ) == {("a", NOW): Decimal(3)}


# Through the API, from what ingest keeps.


class Pod:
    """A pod that reports consecutive intervals ending at the clock's now, like its sidecar would."""

    def __init__(self, api: Api, clock: ManualClock, namespace: str, share: float = 1.0) -> None:
        self.api, self.clock, self.namespace, self.share = api, clock, namespace, share
        self.seq = 0

    async def runs(self, minutes: float) -> None:
        for _ in range(int(minutes // 30)):  # 30-minute reports: every interval the API accepts
            self.seq += 1
            start = self.clock.now()
            self.clock.advance(timedelta(minutes=30))
            ok(
                await self.api.report(
                    namespace=self.namespace,
                    pod=f"pod-{self.namespace}",
                    pod_uid=f"uid-{self.namespace}",
                    seq=self.seq,
                    start=start,
                    minutes=30,
                    gpu_share=self.share,
                )
            )


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.asyncio(loop_scope="session")
async def test_the_budget_answers_the_burn_rate_and_when_the_budget_runs_out(
    api: Api, clock: ManualClock
) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=1000))
    await Pod(api, clock, "team-a", share=2).runs(180)  # 360 GPU-minutes in three hours

    forecast = (await api.budget("team-a"))["forecast"]

    # Six hours' window, of which three burnt 360: 60 an hour; 640 left: in 10 h 40 min.
    assert forecast == {
        "window_minutes": 360,
        "burn_rate_gpu_minutes_per_hour": 60,
        "exhausts_at": (clock.now() + timedelta(hours=10, minutes=40)).isoformat().replace("+00:00", "Z"),
    }


@pytest.mark.asyncio(loop_scope="session")
async def test_a_grant_through_the_api_moves_the_exhaustion_later(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=1000))
    await Pod(api, clock, "team-a", share=2).runs(180)
    before = at((await api.budget("team-a"))["forecast"]["exhausts_at"])

    granted = ok(await api.grant("team-a", 120))

    after = at(granted["budget"]["forecast"]["exhausts_at"])
    assert after - before == timedelta(hours=2)  # 120 more at 60 an hour


@pytest.mark.asyncio(loop_scope="session")
async def test_only_the_window_counts_toward_the_rate(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=10_000))
    pod = Pod(api, clock, "team-a")
    await pod.runs(120)
    clock.advance(timedelta(hours=5))  # two hours of use, then five idle: one hour of it is in the window

    forecast = (await api.budget("team-a"))["forecast"]

    assert forecast["burn_rate_gpu_minutes_per_hour"] == 10  # 60 GPU-minutes in six hours


@pytest.mark.asyncio(loop_scope="session")
async def test_no_burn_and_unlimited_and_a_daily_period_ending_first_forecast_nothing(
    api: Api, clock: ManualClock
) -> None:
    ok(await api.put_budget("idle", budget_gpu_minutes=100))
    ok(await api.put_budget("unlimited", budget_gpu_minutes=None))
    ok(await api.put_budget("daily", budget_gpu_minutes=1000, period="daily"))
    await Pod(api, clock, "unlimited").runs(60)
    await Pod(api, clock, "daily").runs(60)  # 10 an hour; 990 left would last past midnight

    listed = {
        entry["namespace"]: entry["forecast"]
        for entry in ok(await api.get("/namespaces"))
        if entry["namespace"] in {"idle", "unlimited", "daily"}
    }

    assert listed["idle"] == {"window_minutes": 360, "burn_rate_gpu_minutes_per_hour": 0, "exhausts_at": None}
    assert listed["unlimited"]["burn_rate_gpu_minutes_per_hour"] == 10
    assert listed["unlimited"]["exhausts_at"] is None
    assert listed["daily"]["burn_rate_gpu_minutes_per_hour"] == 10
    assert listed["daily"]["exhausts_at"] is None


@pytest.mark.asyncio(loop_scope="session")
async def test_the_list_forecasts_each_namespace_from_its_own_burn(api: Api, clock: ManualClock) -> None:
    for namespace in ("team-a", "team-b"):
        ok(await api.put_budget(namespace, budget_gpu_minutes=600))
    await Pod(api, clock, "team-a", share=1).runs(60)
    await Pod(api, clock, "team-b", share=4).runs(60)

    listed = {entry["namespace"]: entry for entry in ok(await api.get("/namespaces"))}

    now = clock.now()
    team_a, team_b = listed["team-a"]["forecast"], listed["team-b"]["forecast"]
    assert (team_a["burn_rate_gpu_minutes_per_hour"], team_b["burn_rate_gpu_minutes_per_hour"]) == (10, 40)
    assert at(team_a["exhausts_at"]) == now + timedelta(hours=54)  # 540 left at 10 an hour
    assert at(team_b["exhausts_at"]) == now + timedelta(hours=9)  # 360 left at 40 an hour
    assert listed["team-a"]["forecast"] == (await api.budget("team-a"))["forecast"]


@pytest.mark.asyncio(loop_scope="session")
async def test_an_exhausted_namespace_keeps_its_state_and_forecasts_nothing_more(
    api: Api, clock: ManualClock
) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=30))
    await Pod(api, clock, "team-a").runs(60)

    status = await api.budget("team-a")

    assert status["state"] == "exhausted"
    assert status["forecast"]["burn_rate_gpu_minutes_per_hour"] == 10
    assert status["forecast"]["exhausts_at"] is None


@pytest.mark.asyncio(loop_scope="session")
async def test_time_folded_by_the_roll_up_still_counts_when_the_window_reaches_back_that_far(
    app: FastAPI, api: Api, clock: ManualClock
) -> None:
    context = current(app)
    window = {"forecast_window_minutes": 8 * 24 * 60}
    expose(app, replace(context, settings=context.settings.model_copy(update=window)))
    ok(await api.put_budget("team-a", budget_gpu_minutes=100_000, period="none"))
    await Pod(api, clock, "team-a").runs(24 * 60)  # 24 hours of one GPU: 1,440 GPU-minutes
    clock.advance(timedelta(days=7))
    before = (await api.budget("team-a"))["forecast"]

    await run(app, "rollup")

    assert before["burn_rate_gpu_minutes_per_hour"] == pytest.approx(1440 / 192, abs=1e-6)
    assert (await api.budget("team-a"))["forecast"] == before


@pytest.mark.asyncio(loop_scope="session")
async def test_metrics_show_the_burn_rate_and_the_seconds_left_only_where_a_forecast_exists(
    app: FastAPI, api: Api, clock: ManualClock
) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=600))
    ok(await api.put_budget("idle", budget_gpu_minutes=600))
    await Pod(api, clock, "team-a", share=4).runs(60)  # 40 an hour; 360 left: nine hours

    async with root_client(app) as client:
        scraped = samples((await client.get("/metrics")).text)

    team_a, idle = (("namespace", "team-a"),), (("namespace", "idle"),)
    assert scraped[("timekeeper_namespace_burn_rate_gpu_minutes_per_hour", team_a)] == 40
    assert scraped[("timekeeper_namespace_forecast_exhaustion_seconds", team_a)] == 9 * 3600
    assert scraped[("timekeeper_namespace_burn_rate_gpu_minutes_per_hour", idle)] == 0
    assert ("timekeeper_namespace_forecast_exhaustion_seconds", idle) not in scraped


async def report_steadily(api: Api, clock: ManualClock, namespace: str, minutes: float, every: float) -> None:
    """One GPU reported in `every`-minute intervals ending at the clock's now (not aligned to buckets)."""
    for seq in range(1, int(minutes // every) + 1):
        start = clock.now()
        clock.advance(timedelta(minutes=every))
        ok(
            await api.report(
                namespace=namespace,
                pod="pod",
                pod_uid=f"uid-{namespace}",
                seq=seq,
                start=start,
                minutes=every,
            )
        )


@pytest.mark.asyncio(loop_scope="session")
async def test_the_burn_is_exact_across_bucket_boundaries_and_prorated_at_the_window_edge(
    api: Api, clock: ManualClock
) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=10_000))
    await report_steadily(api, clock, "team-a", 60, every=7.5)  # reports straddle the 5-minute buckets

    assert (await api.budget("team-a"))["forecast"]["burn_rate_gpu_minutes_per_hour"] == 10  # 60 in 6 h

    # The window now starts 37.5 minutes into the hour of use, halfway through a bucket: 22.5 minutes of
    # it are inside, half of that bucket's among them.
    clock.advance(timedelta(hours=5, minutes=37.5))
    assert (await api.budget("team-a"))["forecast"]["burn_rate_gpu_minutes_per_hour"] == 3.75


@pytest.mark.asyncio(loop_scope="session")
async def test_the_burn_is_kept_by_ingest_not_recomputed_from_the_ledger(
    api: Api, clock: ManualClock, connection: AsyncConnection
) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=1000))
    await report_steadily(api, clock, "team-a", 60, every=7.5)
    ledger = (
        await connection.execute(
            sa.text("SELECT sum(gpu_minutes) FROM usage_ledger WHERE namespace = 'team-a'")
        )
    ).scalar_one()
    buckets = (
        await connection.execute(
            sa.text("SELECT sum(gpu_minutes) FROM usage_burn WHERE namespace = 'team-a'")
        )
    ).scalar_one()
    assert ledger == buckets == 60  # every charged GPU-minute went to a bucket, exactly once

    ok(await api.grant("team-a", 500))  # grants do not burn
    await connection.execute(sa.text("DELETE FROM usage_ledger WHERE namespace = 'team-a'"))

    assert (await api.budget("team-a"))["forecast"]["burn_rate_gpu_minutes_per_hour"] == 10


@pytest.mark.asyncio(loop_scope="session")
async def test_the_roll_up_drops_burn_buckets_no_window_reaches_and_keeps_the_rest(
    app: FastAPI, api: Api, clock: ManualClock, connection: AsyncConnection
) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=10_000))
    await report_steadily(api, clock, "team-a", 60, every=7.5)  # 12 buckets, 12:00-13:00
    clock.advance(timedelta(hours=6, days=1))  # the window (6 h) plus the margin (a day) from 13:00
    await report_steadily(api, clock, "team-b", 60, every=7.5)  # 12 more, a day later

    assert (await run(app, "rollup")).detail["burn_buckets_purged"] == 12

    kept = await connection.execute(sa.text("SELECT DISTINCT namespace FROM usage_burn"))
    assert {namespace for (namespace,) in kept} == {"team-b"}
    assert (await api.budget("team-b"))["forecast"]["burn_rate_gpu_minutes_per_hour"] == 10
