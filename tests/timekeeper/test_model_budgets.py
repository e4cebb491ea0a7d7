"""Budgets per GPU model (issue #41): a model's raw GPU-minutes count against its own budget and, weighted,
against the total; the admission snapshot lists the exhausted models."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.support.timekeeper import Api, bearer, ok
from tests.timekeeper.test_billing import H100, T4, gpu, put_weight
from tests.timekeeper.test_health import samples
from tests.timekeeper.test_pools import members, put_pool
from timekeeper.clock import ManualClock

pytestmark = pytest.mark.asyncio(loop_scope="session")

H100_KEY = "NVIDIA-H100-80GB-HBM3"
T4_KEY = "Tesla-T4"


async def run(
    api: Api,
    clock: ManualClock,
    minutes: float,
    model: str | None,
    namespace: str = "team-a",
    pod: str = "trainer",
    seq: int = 1,
    share: float = 1.0,
) -> dict[str, Any]:
    """One report of `minutes` ending now, on a GPU NVML names `model` (None: a GPU without a name)."""
    start = clock.now()
    clock.advance(timedelta(minutes=minutes))
    return ok(
        await api.report(
            namespace=namespace,
            pod=pod,
            pod_uid=f"uid-{namespace}-{pod}",
            seq=seq,
            start=start,
            minutes=minutes,
            gpu_share=share,
            gpus=gpu(model),
        )
    )


async def snapshot_entry(api: Api, namespace: str) -> dict[str, Any] | None:
    entry: dict[str, Any] | None = ok(await api.get("/admission-state"))["namespaces"].get(namespace)
    return entry


async def test_the_h100_budget_is_exhausted_while_the_total_is_in_budget(
    api: Api, clock: ManualClock
) -> None:
    ok(
        await api.put_budget(
            "team-a", budget_gpu_minutes=100000, models={H100_KEY: {"budget_gpu_minutes": 10}}
        )
    )

    ack = await run(api, clock, 10, H100)

    assert ack["state"] == "in_budget"  # the total's
    status = await api.budget("team-a")
    assert status["state"] == "in_budget"
    h100 = status["models"][H100_KEY]
    assert (h100["budget_gpu_minutes"], h100["used_gpu_minutes"], h100["remaining_gpu_minutes"]) == (
        10,
        10,
        0,
    )
    assert h100["state"] == "exhausted"
    assert h100["forecast"]["exhausts_at"] is None  # nothing remains already
    assert status["model_policy"] == "reduce"
    assert status["unknown_model_used_gpu_minutes"] == 0
    entry = await snapshot_entry(api, "team-a")
    assert entry is not None
    assert (entry["state"], entry["exhausted_models"], entry["model_policy"]) == (
        "in_budget",
        [H100_KEY],
        "reduce",
    )
    events = ok(await api.get("/namespaces/team-a/budget/events"))
    assert any(event.get("model") == H100_KEY and event["new_state"] == "exhausted" for event in events)


async def test_a_model_budget_counts_its_model_whatever_the_case_it_is_written_in(
    api: Api, clock: ManualClock
) -> None:
    """The key is the admin's spelling; the minutes are charged under the GPU's own (NVML's, the node
    label's): a budget keyed in lower case still counts them, so it cannot be silently never spent."""
    lower = H100_KEY.lower()
    ok(await api.put_budget("team-a", budget_gpu_minutes=100000, models={lower: {"budget_gpu_minutes": 10}}))

    await run(api, clock, 10, H100)

    status = await api.budget("team-a")
    assert (status["models"][lower]["used_gpu_minutes"], status["models"][lower]["state"]) == (
        10,
        "exhausted",
    )
    entry = await snapshot_entry(api, "team-a")
    assert entry is not None and entry["exhausted_models"] == [lower]


async def test_a_model_minute_is_raw_for_its_model_and_weighted_for_the_total(
    api: Api, clock: ManualClock
) -> None:
    ok(await put_weight(api, H100_KEY, 3, effective_from=(clock.now() + timedelta(minutes=2)).isoformat()))
    clock.advance(timedelta(minutes=2))
    ok(
        await api.put_budget(
            "team-a", budget_gpu_minutes=1000, models={H100_KEY: {"budget_gpu_minutes": 100}}
        )
    )

    await run(api, clock, 10, H100, share=2)
    await run(api, clock, 5, T4, pod="small")

    status = await api.budget("team-a")
    assert status["used_gpu_minutes"] == 2 * 10 * 3 + 5  # weighted, every model
    assert status["models"][H100_KEY]["used_gpu_minutes"] == 20  # raw: share x minutes
    assert status["models"][H100_KEY]["state"] == "in_budget"
    assert T4_KEY not in status["models"]  # not in the map: counted against the total only


async def test_a_model_budget_without_a_total(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=None, models={H100_KEY: {"budget_gpu_minutes": 5}}))

    await run(api, clock, 6, H100)

    status = await api.budget("team-a")
    assert (status["state"], status["budget_gpu_minutes"]) == ("unlimited", None)
    assert status["models"][H100_KEY]["state"] == "exhausted"
    assert status["models"][H100_KEY]["remaining_gpu_minutes"] == -1
    entry = await snapshot_entry(api, "team-a")
    assert entry is not None and entry["exhausted_models"] == [H100_KEY]


async def test_an_unknown_model_counts_against_the_total_only(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=100, models={H100_KEY: {"budget_gpu_minutes": 5}}))

    await run(api, clock, 7, None)

    status = await api.budget("team-a")
    assert status["used_gpu_minutes"] == 7
    assert status["unknown_model_used_gpu_minutes"] == 7
    assert status["models"][H100_KEY]["used_gpu_minutes"] == 0


async def test_minutes_count_under_the_model_known_when_they_were_charged(
    api: Api, clock: ManualClock
) -> None:
    """A pod's model is kept once known (as billing weights keep it); minutes charged before it was known
    stay unknown, and later ones count under the model."""
    ok(await api.put_budget("team-a", budget_gpu_minutes=100, models={H100_KEY: {"budget_gpu_minutes": 50}}))

    await run(api, clock, 4, None, seq=1)
    await run(api, clock, 6, H100, seq=2)

    status = await api.budget("team-a")
    assert status["unknown_model_used_gpu_minutes"] == 4
    assert status["models"][H100_KEY]["used_gpu_minutes"] == 6


async def test_the_default_carries_models_and_its_policy(api: Api, clock: ManualClock) -> None:
    defaults = ok(
        await api.put_defaults(
            budget_gpu_minutes=100,
            models={"NVIDIA H100 80GB HBM3": {"budget_gpu_minutes": 3}},
            model_policy="steer",
        )
    )
    assert defaults["models"] == {H100_KEY: {"budget_gpu_minutes": 3}}  # stored as model_key spells it
    assert defaults["model_policy"] == "steer"

    await run(api, clock, 3, H100, namespace="team-b")

    status = await api.budget("team-b")
    assert (status["source"], status["model_policy"]) == ("default", "steer")
    assert status["models"][H100_KEY]["state"] == "exhausted"
    entry = await snapshot_entry(api, "team-b")
    assert entry is not None and (entry["exhausted_models"], entry["model_policy"]) == ([H100_KEY], "steer")


async def test_two_spellings_of_one_model_are_refused(api: Api) -> None:
    response = await api.put_budget(
        "team-a",
        models={
            "NVIDIA-H100-80GB-HBM3": {"budget_gpu_minutes": 1},
            "nvidia h100 80gb hbm3": {"budget_gpu_minutes": 2},
        },
    )
    assert response.status_code == 422
    bad_policy = await api.put_budget("team-a", model_policy="evict")
    assert bad_policy.status_code == 422
    pool = await put_pool(
        api,
        "vision",
        budget_gpu_minutes=10,
        models={"Tesla T4": {"budget_gpu_minutes": 1}, "TESLA-T4": {"budget_gpu_minutes": 1}},
    )
    assert pool.status_code == 422


async def test_a_snapshot_version_moves_when_a_model_is_exhausted(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=1000, models={H100_KEY: {"budget_gpu_minutes": 8}}))
    await run(api, clock, 4, H100, seq=1)
    before = (await api.get("/admission-state")).headers["etag"]

    await run(api, clock, 4, H100, seq=2)

    response = await api.client.get(
        "/admission-state", headers={"If-None-Match": before, **bearer(api.tokens.reader)}
    )
    assert response.status_code == 200
    assert response.json()["namespaces"]["team-a"]["exhausted_models"] == [H100_KEY]


async def test_a_pools_models_map_governs_its_members_together(api: Api, clock: ManualClock) -> None:
    ok(
        await put_pool(
            api,
            "vision",
            budget_gpu_minutes=1000,
            members=members("team-a", "team-b"),
            models={H100_KEY: {"budget_gpu_minutes": 10}},
            model_policy="steer",
        )
    )

    await run(api, clock, 6, H100, namespace="team-a")
    await run(api, clock, 4, H100, namespace="team-b")

    pool = ok(await api.get("/pools/vision"))
    assert pool["models"][H100_KEY]["used_gpu_minutes"] == 10
    assert pool["models"][H100_KEY]["state"] == "exhausted"
    assert pool["model_policy"] == "steer"
    for namespace in ("team-a", "team-b"):
        status = await api.budget(namespace)
        assert status["models"][H100_KEY]["state"] == "exhausted"
        # The figures the state is decided from: the pool's, every member's H100 minutes together.
        assert (
            status["models"][H100_KEY]["used_gpu_minutes"],
            status["models"][H100_KEY]["remaining_gpu_minutes"],
        ) == (10, 0)
        assert status["model_policy"] == "steer"
        entry = await snapshot_entry(api, namespace)
        assert entry is not None and entry["exhausted_models"] == [H100_KEY]


async def test_metrics_show_each_models_remaining_minutes_and_state(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=100, models={H100_KEY: {"budget_gpu_minutes": 10}}))
    await run(api, clock, 4, H100)

    scraped = samples((await api.client.get("/metrics")).text)

    labels = (("model", H100_KEY), ("namespace", "team-a"))
    assert scraped[("timekeeper_model_budget_remaining_gpu_minutes", labels)] == 6
    assert scraped[("timekeeper_model_budget_state", (*labels, ("state", "in_budget")))] == 1
    assert scraped[("timekeeper_model_budget_state", (*labels, ("state", "exhausted")))] == 0


async def test_each_model_has_its_forecast_from_its_own_burn(api: Api, clock: ManualClock) -> None:
    """Two H100 GPUs for 10 minutes: 20 raw GPU-minutes in the last 10 minutes of the window; the T4's
    minutes burn the total only."""
    ok(
        await api.put_budget(
            "team-a",
            budget_gpu_minutes=100000,
            models={H100_KEY: {"budget_gpu_minutes": 1000}, T4_KEY: {"budget_gpu_minutes": 1000}},
        )
    )
    now = clock.now()
    await run(api, clock, 10, H100, share=2)
    clock.set(now + timedelta(minutes=10))

    status = await api.budget("team-a")

    h100, t4 = status["models"][H100_KEY], status["models"][T4_KEY]
    window_hours = h100["forecast"]["window_minutes"] / 60
    assert h100["forecast"]["burn_rate_gpu_minutes_per_hour"] == pytest.approx(20 / window_hours)
    assert h100["forecast"]["exhausts_at"] is not None
    assert (t4["forecast"]["burn_rate_gpu_minutes_per_hour"], t4["forecast"]["exhausts_at"]) == (0, None)


async def test_a_new_period_kind_rebuilds_the_model_totals_from_the_history(
    api: Api, clock: ManualClock
) -> None:
    """The running model totals of the new kind are rebuilt from the hourly aggregates, as the total's
    are: today's H100 minutes, raw."""
    ok(
        await api.put_budget(
            "team-a", budget_gpu_minutes=1000, models={H100_KEY: {"budget_gpu_minutes": 100}}
        )
    )
    await run(api, clock, 12, H100, share=0.5)
    await run(api, clock, 3, None, pod="unnamed")

    status = ok(
        await api.put_budget(
            "team-a", budget_gpu_minutes=1000, period="daily", models={H100_KEY: {"budget_gpu_minutes": 100}}
        )
    )

    assert status["period"]["kind"] == "daily"
    assert status["models"][H100_KEY]["used_gpu_minutes"] == 6
    assert status["unknown_model_used_gpu_minutes"] == 3
