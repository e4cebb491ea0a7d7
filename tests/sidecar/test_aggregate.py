"""Interval aggregates: mean and max utilisation, max memory, energy growth; None where unknown."""

from __future__ import annotations

from sidecar.aggregate import IntervalAggregate, merge_measurements
from sidecar.gpus import GpuSample

GPU = "GPU-11111111-2222-3333-4444-555555555555"
OTHER = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


def sample(util: float | None, used: int | None, energy: int | None, uuid: str = GPU) -> GpuSample:
    return GpuSample(
        uuid=uuid,
        sm_util_pct=util,
        mem_used_bytes=used,
        mem_total_bytes=None if used is None else 1000,
        energy_millijoules=energy,
    )


def test_interval_figures_are_mean_max_and_energy_growth() -> None:
    aggregate = IntervalAggregate()
    aggregate.add([sample(10, 400, 5000)])
    aggregate.add([sample(None, 700, 6500)])
    aggregate.add([sample(40, 300, 8000)])

    (figures,) = aggregate.cut()

    assert figures == {
        "uuid": GPU,
        "sm_util_pct": 25.0,
        "sm_util_max_pct": 40,
        "mem_used_bytes": 700,
        "mem_total_bytes": 1000,
        "energy_joules": 3.0,
        "status": "ok",
    }


def test_energy_of_the_next_interval_starts_where_the_last_ended() -> None:
    aggregate = IntervalAggregate()
    aggregate.add([sample(10, 1, 1000)])
    aggregate.add([sample(10, 1, 3000)])
    aggregate.cut()
    aggregate.add([sample(10, 1, 4500)])

    (figures,) = aggregate.cut()

    assert figures["energy_joules"] == 1.5


def test_a_counter_that_went_backwards_gives_no_energy() -> None:
    aggregate = IntervalAggregate()
    aggregate.add([sample(10, 1, 9000)])
    aggregate.cut()
    aggregate.add([sample(10, 1, 100)])

    (figures,) = aggregate.cut()

    assert figures["energy_joules"] is None


def test_a_gpu_that_never_answered_is_listed_with_none_figures() -> None:
    aggregate = IntervalAggregate()
    aggregate.add([GpuSample(uuid=OTHER), GpuSample(uuid=OTHER)])

    (figures,) = aggregate.cut()

    assert figures == {
        "uuid": OTHER,
        "sm_util_pct": None,
        "sm_util_max_pct": None,
        "mem_used_bytes": None,
        "mem_total_bytes": None,
        "energy_joules": None,
        "status": "ok",
    }
    assert aggregate.cut() == []


def test_merge_weights_utilisation_by_interval_length() -> None:
    first = {
        "uuid": GPU,
        "sm_util_pct": 10.0,
        "sm_util_max_pct": 20.0,
        "mem_used_bytes": 5,
        "mem_total_bytes": 9,
        "energy_joules": 1.0,
    }
    second = {
        "uuid": GPU,
        "sm_util_pct": 40.0,
        "sm_util_max_pct": 90.0,
        "mem_used_bytes": 7,
        "mem_total_bytes": 9,
        "energy_joules": None,
    }
    third = {
        "uuid": OTHER,
        "sm_util_pct": None,
        "sm_util_max_pct": None,
        "mem_used_bytes": None,
        "mem_total_bytes": None,
        "energy_joules": None,
    }

    merged = merge_measurements([(30, [first]), (10, [second, third])])  # type: ignore[list-item]

    assert merged == [
        {
            "uuid": GPU,
            "sm_util_pct": 17.5,
            "sm_util_max_pct": 90.0,
            "mem_used_bytes": 7,
            "mem_total_bytes": 9,
            "energy_joules": 1.0,
            "status": "ok",
        },
        {**third, "status": "ok"},
    ]
