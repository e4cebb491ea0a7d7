"""Billing weights, prices and the charge basis, as rules: a GPU-minute counts its model's weight from
the weight's time on, budgets are in weighted minutes, usage answers raw beside charged minutes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.support.timekeeper import Api, bearer, ok
from tests.timekeeper.test_scheduler_jobs import run, scalar
from timekeeper.clock import ManualClock

pytestmark = pytest.mark.asyncio(loop_scope="session")

NOON = datetime(2026, 3, 10, 12, tzinfo=UTC)
H100 = "NVIDIA H100 80GB HBM3"
T4 = "Tesla T4"


def gpu(name: str | None, util: float | None = 50.0) -> list[dict[str, Any]]:
    figures: dict[str, Any] = {
        "uuid": "GPU-0",
        "sm_util_pct": util,
        "mem_used_bytes": None,
        "mem_total_bytes": None,
    }
    return [figures | ({"name": name} if name else {})]


async def put_weight(api: Api, model: str, weight: float, **body: Any) -> httpx.Response:
    return await api.client.put(
        f"/billing/weights/{model}", json={"weight": weight, **body}, headers=bearer(api.tokens.admin)
    )


async def usage(api: Api, group_by: str, **window: str) -> dict[str, Any]:
    return ok(await api.get("/namespaces/team-a/usage", group_by=group_by, **window))


async def minutes(api: Api, group_by: str, **window: str) -> list[tuple[str, float, float]]:
    """Each row's charged and raw minutes (its report count changes when reports are folded by hour)."""
    rows = (await usage(api, group_by, **window))["rows"]
    return [(row["key"], row["gpu_minutes"], row["raw_gpu_minutes"]) for row in rows]


@pytest.fixture(autouse=True)
def morning(clock: ManualClock) -> None:
    clock.set(NOON - timedelta(hours=1))


async def test_an_h100_minute_counts_its_weight_and_a_t4_minute_its_own(api: Api, clock: ManualClock) -> None:
    ok(await put_weight(api, "NVIDIA-H100-80GB-HBM3", 3))
    ok(await put_weight(api, "Tesla-T4", 0.5))
    clock.set(NOON + timedelta(minutes=20))

    ok(await api.report(pod="big", pod_uid="uid-big", start=NOON, minutes=10, gpus=gpu(H100)))
    ok(await api.report(pod="small", pod_uid="uid-small", start=NOON, minutes=10, gpus=gpu(T4)))

    by_pod = await usage(api, "pod")
    assert [(r["key"], r["gpu_minutes"], r["raw_gpu_minutes"]) for r in by_pod["rows"]] == [
        ("big", 30, 10),
        ("small", 5, 10),
    ]
    assert (await api.budget("team-a"))["used_gpu_minutes"] == 35
    by_model = await usage(api, "model")
    assert [(r["key"], r["gpu_minutes"]) for r in by_model["rows"]] == [
        ("NVIDIA-H100-80GB-HBM3", 30),
        ("Tesla-T4", 5),
    ]


async def test_a_pod_whose_model_is_unknown_counts_one(api: Api, clock: ManualClock) -> None:
    ok(await put_weight(api, "Tesla-T4", 0.5))
    clock.set(NOON + timedelta(minutes=20))

    ack = ok(await api.report(start=NOON, minutes=10, gpus=gpu(None)))

    assert ack["gpu_minutes"] == 10
    assert [(r["key"], r["gpu_minutes"]) for r in (await usage(api, "model"))["rows"]] == [("unknown", 10)]


async def test_the_first_model_known_for_a_pod_stays_its_model(api: Api, clock: ManualClock) -> None:
    ok(await put_weight(api, "Tesla-T4", 0.5))
    clock.set(NOON + timedelta(minutes=30))

    ok(await api.report(seq=1, start=NOON, minutes=10, gpus=gpu(T4)))
    ack = ok(await api.report(seq=2, start=NOON + timedelta(minutes=10), minutes=10, gpus=gpu(None)))

    assert ack["gpu_minutes"] == 5


async def test_a_pod_keeps_its_first_model_when_a_report_names_another(api: Api, clock: ManualClock) -> None:
    ok(await put_weight(api, "Tesla-T4", 0.5))
    ok(await put_weight(api, "NVIDIA-H100-80GB-HBM3", 3))
    clock.set(NOON + timedelta(minutes=30))

    ok(await api.report(seq=1, start=NOON, minutes=10, gpus=gpu(T4)))
    ack = ok(await api.report(seq=2, start=NOON + timedelta(minutes=10), minutes=10, gpus=gpu(H100)))

    assert ack["gpu_minutes"] == 5


async def test_a_change_set_between_reports_counts_from_its_time_on(api: Api, clock: ManualClock) -> None:
    ok(await put_weight(api, "Tesla-T4", 0.5))
    clock.set(NOON + timedelta(minutes=5))
    ok(await api.report(seq=1, start=NOON, minutes=5, gpus=gpu(T4)))

    ok(await put_weight(api, "Tesla-T4", 2, effective_from="2026-03-10T12:10:00Z"))
    clock.set(NOON + timedelta(minutes=30))
    ack = ok(await api.report(seq=2, start=NOON + timedelta(minutes=5), minutes=10, gpus=gpu(T4)))

    assert ack["gpu_minutes"] == 5 * 0.5 + 5 * 2


async def test_a_weight_change_mid_pod_applies_from_its_time_on(api: Api, clock: ManualClock) -> None:
    ok(await put_weight(api, "Tesla-T4", 2, effective_from="2026-03-10T12:10:00Z"))
    clock.set(NOON + timedelta(minutes=5))
    ok(await api.report(seq=1, start=NOON, minutes=5, gpus=gpu(T4)))
    clock.set(NOON + timedelta(minutes=30))
    # 12:05-12:15 straddles the change: 5 minutes at 1, 5 at 2.
    ok(await api.report(seq=2, start=NOON + timedelta(minutes=5), minutes=10, gpus=gpu(T4)))
    ok(await api.report(seq=3, start=NOON + timedelta(minutes=15), minutes=10, gpus=gpu(T4)))

    assert (await api.budget("team-a"))["used_gpu_minutes"] == 5 + (5 + 10) + 20
    by_hour = await usage(api, "hour")
    assert [(r["gpu_minutes"], r["raw_gpu_minutes"]) for r in by_hour["rows"]] == [(40, 25)]


async def test_a_later_change_never_reweights_time_already_charged(api: Api, clock: ManualClock) -> None:
    ok(await put_weight(api, "Tesla-T4", 2))
    clock.set(NOON + timedelta(minutes=20))
    ok(await api.report(start=NOON, minutes=10, gpus=gpu(T4)))

    ok(await put_weight(api, "Tesla-T4", 7))

    assert (await api.budget("team-a"))["used_gpu_minutes"] == 20
    assert (await usage(api, "pod"))["total_gpu_minutes"] == 20


async def test_a_weight_cannot_start_in_the_past(api: Api, clock: ManualClock) -> None:
    response = await put_weight(api, "Tesla-T4", 2, effective_from="2026-03-10T10:00:00Z")

    assert response.status_code == 422
    assert "never re-weighted" in response.json()["detail"]


async def test_weights_are_listed_audited_and_reset(api: Api, clock: ManualClock) -> None:
    ok(await put_weight(api, "Tesla T4", 0.5))
    ok(await put_weight(api, "NVIDIA-H100-80GB-HBM3", 3, effective_from="2026-03-11T00:00:00Z"))
    clock.set(NOON)

    listed = ok(await api.client.get("/billing/weights", headers=bearer(api.tokens.reader)))
    assert [(w["model"], w["weight"]) for w in listed["weights"]] == [("Tesla-T4", 0.5)]
    assert [(w["model"], w["effective_from"]) for w in listed["scheduled"]] == [
        ("NVIDIA-H100-80GB-HBM3", "2026-03-11T00:00:00Z")
    ]
    ok(await api.client.delete("/billing/weights/Tesla-T4", headers=bearer(api.tokens.admin)))
    clock.set(NOON + timedelta(minutes=1))
    assert ok(await api.client.get("/billing/weights", headers=bearer(api.tokens.reader)))["weights"] == []
    audit = ok(await api.get("/audit"))
    assert [entry["action"] for entry in audit][:3] == ["weight.reset", "weight.put", "weight.put"]
    assert (
        await api.client.delete("/billing/weights/A100", headers=bearer(api.tokens.admin))
    ).status_code == 404


async def test_only_admins_set_weights(api: Api) -> None:
    response = await api.client.put(
        "/billing/weights/Tesla-T4", json={"weight": 2}, headers=bearer(api.tokens.reader)
    )
    assert response.status_code == 403


async def test_the_measured_basis_charges_utilisation_with_a_floor_and_allocation_without_figures(
    api: Api, clock: ManualClock
) -> None:
    basis = {"basis": "measured", "floor": 0.2}
    ok(await api.client.put("/namespaces/team-a/charge-basis", json=basis, headers=bearer(api.tokens.admin)))
    clock.set(NOON + timedelta(minutes=40))

    busy = ok(await api.report(pod="busy", pod_uid="uid-busy", start=NOON, minutes=10, gpus=gpu(T4, 60.0)))
    idle = ok(await api.report(pod="idle", pod_uid="uid-idle", start=NOON, minutes=10, gpus=gpu(T4, 3.0)))
    blind = ok(await api.report(pod="blind", pod_uid="uid-blind", start=NOON, minutes=10, gpus=gpu(T4, None)))
    other = ok(
        await api.report(namespace="team-b", pod_uid="uid-b", start=NOON, minutes=10, gpus=gpu(T4, 3.0))
    )

    assert (busy["gpu_minutes"], idle["gpu_minutes"], blind["gpu_minutes"]) == (6, 2, 10)
    assert other["gpu_minutes"] == 10  # team-b follows the cluster: allocation
    rows = (await usage(api, "pod"))["rows"]
    assert [(r["key"], r["gpu_minutes"], r["raw_gpu_minutes"]) for r in rows] == [
        ("blind", 10, 10),
        ("busy", 6, 10),
        ("idle", 2, 10),
    ]
    got = ok(await api.client.get("/namespaces/team-a/charge-basis", headers=bearer(api.tokens.reader)))
    assert got == {"basis": "measured", "floor": 0.2, "source": "namespace"}


async def test_the_cluster_basis_governs_namespaces_without_their_own(api: Api, clock: ManualClock) -> None:
    admin = bearer(api.tokens.admin)
    ok(await api.client.put("/billing/charge-basis", json={"basis": "measured", "floor": 0.5}, headers=admin))
    clock.set(NOON + timedelta(minutes=20))

    ack = ok(await api.report(start=NOON, minutes=10, gpus=gpu(None, 10.0)))

    assert ack["gpu_minutes"] == 5
    got = ok(await api.client.get("/namespaces/team-a/charge-basis", headers=bearer(api.tokens.reader)))
    assert got["source"] == "cluster"
    assert ok(await api.client.delete("/billing/charge-basis", headers=admin))["source"] == "shipped"
    assert (await api.client.delete("/namespaces/team-a/charge-basis", headers=admin)).status_code == 404


async def test_prices_are_set_listed_and_removed(api: Api) -> None:
    admin = bearer(api.tokens.admin)
    ok(
        await api.client.put(
            "/billing/prices/NVIDIA H100 80GB HBM3", json={"price_per_gpu_hour": 2.5}, headers=admin
        )
    )

    listed = ok(await api.client.get("/billing/prices", headers=bearer(api.tokens.reader)))
    assert [(p["model"], p["price_per_gpu_hour"], p["currency"]) for p in listed] == [
        ("NVIDIA-H100-80GB-HBM3", 2.5, "USD")
    ]
    assert (
        await api.client.delete("/billing/prices/NVIDIA-H100-80GB-HBM3", headers=admin)
    ).status_code == 204
    assert (
        await api.client.delete("/billing/prices/NVIDIA-H100-80GB-HBM3", headers=admin)
    ).status_code == 404


async def test_weighted_answers_survive_the_roll_up_and_a_period_change(
    api: Api, app: FastAPI, clock: ManualClock, connection: AsyncConnection
) -> None:
    ok(await put_weight(api, "Tesla-T4", 3, effective_from="2026-03-10T12:10:00Z"))
    clock.set(NOON + timedelta(hours=2))
    ok(await api.put_budget("team-a", budget_gpu_minutes=1000, period="monthly"))
    ok(await api.report(seq=1, start=NOON, minutes=25, gpu_share=0.5, gpus=gpu(T4)))
    ok(await api.report(seq=2, start=NOON + timedelta(minutes=25), minutes=50, gpu_share=0.5, gpus=gpu(T4)))
    window = {"since": "2026-03-10T00:00:00Z", "until": "2026-03-11T00:00:00Z"}
    before = [await minutes(api, group_by, **window) for group_by in ("pod", "hour", "model")]
    used = (await api.budget("team-a"))["used_gpu_minutes"]
    assert used == pytest.approx(0.5 * (10 + 3 * 65))

    clock.set(NOON + timedelta(days=8))
    await run(app, "rollup")

    assert await scalar(connection, "SELECT count(*) FROM usage_ledger WHERE namespace = 'team-a'") == 0
    assert [await minutes(api, group_by, **window) for group_by in ("pod", "hour", "model")] == before
    ok(
        await api.put_budget("team-a", budget_gpu_minutes=1000, period="none")
    )  # totals rebuilt from the ledger
    assert (await api.budget("team-a"))["used_gpu_minutes"] == pytest.approx(used)


async def test_running_pods_without_a_known_model_are_counted_on_metrics(
    api: Api, clock: ManualClock
) -> None:
    clock.set(NOON + timedelta(minutes=20))
    ok(await api.report(pod="blind", pod_uid="uid-blind", start=NOON, minutes=10, gpus=gpu(None)))
    ok(await api.report(pod="named", pod_uid="uid-named", start=NOON, minutes=10, gpus=gpu(T4)))

    scrape = (await api.client.get("/metrics")).text

    assert 'timekeeper_pods_without_gpu_model{namespace="team-a"} 1.0' in scrape
