"""Charging rules: charge = gpu_share x the minutes of the pod's time not already charged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.support.timekeeper import Api, ok
from tests.timekeeper.conftest import START
from timekeeper.clock import ManualClock
from timekeeper.usage.schemas import GpuFiguresIn, gpu_entry

pytestmark = pytest.mark.asyncio(loop_scope="session")

T0 = START - timedelta(hours=2)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


async def used(api: Api, namespace: str = "team-a") -> float:
    return (await api.budget(namespace))["used_gpu_minutes"]


async def test_a_report_charges_share_times_minutes(api: Api) -> None:
    ack = ok(await api.report(seq=1, start=at(0), minutes=3, gpu_share=0.5))

    assert ack == {"duplicate": False, "gpu_minutes": 1.5, "state": "unlimited"}
    assert await used(api) == 1.5


async def test_a_retried_report_is_a_duplicate_and_charges_nothing(api: Api) -> None:
    first = ok(await api.report(seq=7, start=at(0), minutes=1, gpu_share=2))
    retry = ok(await api.report(seq=7, start=at(0), minutes=1, gpu_share=2))

    assert first["duplicate"] is False and first["gpu_minutes"] == 2
    assert retry["duplicate"] is True and retry["gpu_minutes"] == 0
    assert await used(api) == 2


async def test_after_a_sidecar_restart_an_overlapping_interval_charges_only_the_uncovered_part(
    api: Api,
) -> None:
    ok(await api.report(seq=1, start=at(0), minutes=1))
    ok(await api.report(seq=2, start=at(1), minutes=1))
    # The restarted sidecar starts numbering again and re-sends time partly charged already.
    restarted = ok(await api.report(seq=1, start=at(1.5), minutes=1))

    assert restarted["duplicate"] is False
    assert restarted["gpu_minutes"] == 0.5
    assert await used(api) == 2.5


async def test_a_reused_seq_with_a_different_interval_is_new_data(api: Api) -> None:
    ok(await api.report(seq=1, start=at(0), minutes=1))
    reused = ok(await api.report(seq=1, start=at(5), minutes=1))

    assert reused == {"duplicate": False, "gpu_minutes": 1.0, "state": "unlimited"}
    assert await used(api) == 2


async def test_an_interval_already_covered_charges_nothing_but_is_recorded(
    api: Api, connection: AsyncConnection
) -> None:
    ok(await api.report(seq=1, start=at(0), minutes=10))
    inside = ok(await api.report(seq=2, start=at(2), minutes=3))

    assert inside == {"duplicate": False, "gpu_minutes": 0.0, "state": "unlimited"}
    rows = (await connection.execute(sa.text("SELECT seq, gpu_minutes FROM usage_ledger ORDER BY seq"))).all()
    assert [(row.seq, float(row.gpu_minutes)) for row in rows] == [(1, 10.0), (2, 0.0)]


async def test_late_out_of_order_intervals_are_each_charged_once(api: Api) -> None:
    ok(await api.report(seq=3, start=at(2), minutes=1))
    ok(await api.report(seq=1, start=at(0), minutes=1))
    ok(await api.report(seq=2, start=at(1), minutes=1))
    ok(await api.report(seq=2, start=at(1), minutes=1))

    assert await used(api) == 3


async def test_a_gap_filled_by_a_wider_late_report_charges_only_the_gap(api: Api) -> None:
    ok(await api.report(seq=1, start=at(0), minutes=1))
    ok(await api.report(seq=3, start=at(2), minutes=1))
    spanning = ok(await api.report(seq=9, start=at(0), minutes=3))

    assert spanning["gpu_minutes"] == 1
    assert await used(api) == 3


async def test_fractional_shares_are_charged_exactly(api: Api, connection: AsyncConnection) -> None:
    for seq in range(3):
        ok(await api.report(seq=seq, start=at(seq * 0.5), minutes=0.5, gpu_share=1 / 3))

    total = (await connection.execute(sa.text("SELECT sum(gpu_minutes) FROM usage_ledger"))).scalar_one()
    # 3 x (1/3 x 0.5 min): each charge exact to the nano-GPU-minute, so the sum is off by at most 3 of them.
    assert abs(total - Decimal("0.5")) <= Decimal("3e-9")


async def test_pods_are_charged_independently(api: Api) -> None:
    ok(await api.report(pod="a", pod_uid="uid-a", seq=1, start=at(0), minutes=1))
    ok(await api.report(pod="b", pod_uid="uid-b", seq=1, start=at(0), minutes=1))

    assert await used(api) == 2


async def test_a_report_across_a_month_boundary_is_split_between_the_months(
    api: Api, clock: ManualClock
) -> None:
    boundary = datetime(2026, 4, 1, tzinfo=UTC)
    clock.set(boundary + timedelta(minutes=30))
    ok(await api.put_budget("team-a", budget_gpu_minutes=1000, period="monthly"))

    ack = ok(await api.report(seq=1, start=boundary - timedelta(minutes=10), minutes=30, gpu_share=2))

    assert ack["gpu_minutes"] == 60
    april = await api.budget("team-a")
    assert april["period"]["start"] == "2026-04-01T00:00:00Z"
    assert april["used_gpu_minutes"] == 40  # 20 minutes of April at 2 GPUs
    march = ok(
        await api.get("/namespaces/team-a/usage", since="2026-03-01T00:00:00Z", until="2026-04-01T00:00:00Z")
    )
    assert march["total_gpu_minutes"] == 20


async def test_a_late_report_for_last_month_does_not_count_against_this_month(
    api: Api, clock: ManualClock
) -> None:
    clock.set(datetime(2026, 4, 1, 0, 5, tzinfo=UTC))
    ok(await api.put_budget("team-a", budget_gpu_minutes=10, period="monthly"))

    ack = ok(await api.report(seq=1, start=datetime(2026, 3, 31, 23, 0, tzinfo=UTC), minutes=30))

    assert ack["gpu_minutes"] == 30
    assert ack["state"] == "in_budget"
    assert await used(api) == 0


async def test_the_ledger_keeps_the_measured_figures_beside_the_charge(
    api: Api, connection: AsyncConnection
) -> None:
    gpus = [
        {"uuid": "GPU-a", "sm_util_pct": 20.0, "mem_used_bytes": 100, "mem_total_bytes": 1000},
        {"uuid": "GPU-b", "sm_util_pct": 60.0, "mem_used_bytes": 700, "mem_total_bytes": 1000},
        {"uuid": "GPU-c", "sm_util_pct": None, "mem_used_bytes": None, "mem_total_bytes": None},
    ]
    ok(await api.report(seq=1, start=at(0), minutes=1, gpu_share=3, gpus=gpus, final=True))

    row = (await connection.execute(sa.text("SELECT * FROM usage_ledger"))).one()
    assert (float(row.mean_sm_util_pct), row.mem_used_bytes) == (40.0, 800)
    assert row.final is True
    assert [gpu_entry(gpu) for gpu in row.gpus] == [
        GpuFiguresIn.model_validate(gpu).model_dump() for gpu in gpus
    ]
    assert row.gpus[2] == ["GPU-c"]  # kept positionally, trailing nulls left out


async def test_the_ledger_keeps_each_gpus_status_identity_and_the_pods_own_figures(
    api: Api, connection: AsyncConnection
) -> None:
    """A time-sliced GPU: the device is 85 % busy, this pod's processes 25 % of it. The pod's own figures
    are what its usage shows; the device's stay in the ledger beside them."""
    gpus = [
        {
            "uuid": "GPU-shared",
            "sm_util_pct": 85.0,
            "mem_used_bytes": 3000,
            "mem_total_bytes": 8000,
            "status": "ok",
            "name": "NVIDIA A100-SXM4-80GB",
            "pod_sm_util_pct": 25.0,
            "pod_sm_util_max_pct": 40.0,
            "pod_mem_used_bytes": 1000,
            "pod_processes": 2,
        },
        {
            "uuid": "MIG-lost",
            "sm_util_pct": None,
            "mem_used_bytes": None,
            "mem_total_bytes": None,
            "status": "lost",
            "parent_uuid": "GPU-parent",
        },
    ]
    ok(await api.report(seq=1, start=at(0), minutes=1, gpus=gpus))

    row = (await connection.execute(sa.text("SELECT * FROM usage_ledger"))).one()
    assert (float(row.mean_sm_util_pct), row.mem_used_bytes) == (25.0, 1000)
    shared, lost = map(gpu_entry, row.gpus)
    assert {
        k: shared[k] for k in ("status", "name", "pod_sm_util_pct", "pod_mem_used_bytes", "pod_processes")
    } == {
        "status": "ok",
        "name": "NVIDIA A100-SXM4-80GB",
        "pod_sm_util_pct": 25.0,
        "pod_mem_used_bytes": 1000,
        "pod_processes": 2,
    }
    assert shared["sm_util_pct"] == 85.0
    assert (lost["status"], lost["parent_uuid"]) == ("lost", "GPU-parent")


async def test_an_unknown_gpu_status_is_refused(api: Api) -> None:
    gpus = [
        {"uuid": "GPU-a", "sm_util_pct": 1.0, "mem_used_bytes": 1, "mem_total_bytes": 2, "status": "on fire"}
    ]

    response = await api.report(seq=1, start=at(0), minutes=1, gpus=gpus)

    assert response.status_code == 422


async def test_a_pod_uid_seen_in_another_namespace_is_refused(api: Api) -> None:
    ok(await api.report(namespace="team-a", seq=1, start=at(0)))

    response = await api.report(namespace="team-b", seq=2, start=at(1))

    assert response.status_code == 409
    assert "team-a" in response.json()["detail"]
