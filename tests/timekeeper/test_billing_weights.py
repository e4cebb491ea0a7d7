"""The weight rules alone: one spelling per GPU model, a weight from its time on, the charge basis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from timekeeper.domain.weights import (
    SHIPPED_BASIS,
    Basis,
    WeightChange,
    WeightTimeline,
    charge_share,
    model_key,
    timelines,
)

T0 = datetime(2026, 3, 18, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("nvml", "gfd"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("Tesla T4", "Tesla-T4"),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"),
    ],
)
def test_nvml_names_and_feature_discovery_labels_name_a_model_alike(nvml: str, gfd: str) -> None:
    assert model_key(nvml) == model_key(gfd) == gfd


def test_a_model_never_weighted_counts_one() -> None:
    assert WeightTimeline().weight_at(T0) == 1
    assert WeightTimeline().pieces(T0, T0 + timedelta(minutes=1)) == [(T0, T0 + timedelta(minutes=1), 1)]


def test_a_weight_holds_from_its_time_until_the_next_change() -> None:
    [timeline] = timelines(
        [
            ("H100", T0 + timedelta(minutes=10), Decimal("1.5")),
            ("H100", T0, Decimal(3)),
        ]
    ).values()

    assert timeline.weight_at(T0 - timedelta(seconds=1)) == 1
    assert timeline.weight_at(T0) == 3
    assert timeline.weight_at(T0 + timedelta(minutes=10)) == Decimal("1.5")
    assert timeline.pieces(T0 - timedelta(minutes=5), T0 + timedelta(minutes=15)) == [
        (T0 - timedelta(minutes=5), T0, 1),
        (T0, T0 + timedelta(minutes=10), 3),
        (T0 + timedelta(minutes=10), T0 + timedelta(minutes=15), Decimal("1.5")),
    ]


def test_a_change_at_a_piece_boundary_does_not_cut_it() -> None:
    timeline = WeightTimeline((WeightChange(T0, Decimal(2)),))
    assert timeline.pieces(T0, T0 + timedelta(minutes=1)) == [(T0, T0 + timedelta(minutes=1), 2)]


def test_the_integer_sum_is_each_piece_at_its_weight_exactly() -> None:
    """Charging sums weight x µs in integers (10^-scale of a weight); it must be the pieces' sum, exactly,
    whatever the weights' decimals and wherever the range starts and ends."""
    timeline = WeightTimeline(
        (
            WeightChange(T0, Decimal("2.5")),
            WeightChange(T0 + timedelta(minutes=10), Decimal("0.333333")),
            WeightChange(T0 + timedelta(minutes=20), Decimal(4)),
        )
    )
    edges = [T0 + timedelta(minutes=m, microseconds=u) for m in (-5, 0, 3, 10, 15, 20, 40) for u in (0, 7)]
    for lower in edges:
        for upper in (edge for edge in edges if edge > lower):
            exact = sum(
                (
                    weight * int((end - start) / timedelta(microseconds=1))
                    for start, end, weight in timeline.pieces(lower, upper)
                ),
                Decimal(0),
            )
            assert Decimal(timeline.weighted_microseconds(lower, upper)).scaleb(-timeline.scale) == exact
    assert WeightTimeline().weighted_microseconds(T0, T0 + timedelta(seconds=30)) == 30_000_000


def test_the_allocation_basis_charges_the_share() -> None:
    assert charge_share(Decimal("0.5"), SHIPPED_BASIS, 12.0) == Decimal("0.5")


def test_the_measured_basis_charges_share_times_utilisation_in_whole_percent() -> None:
    basis = Basis("measured", Decimal("0.1"))
    assert charge_share(Decimal("0.5"), basis, 40.4) == Decimal("0.200")
    assert charge_share(Decimal(2), basis, 100.0) == Decimal(2)


def test_the_measured_basis_charges_at_least_the_floor() -> None:
    assert charge_share(Decimal(1), Basis("measured", Decimal("0.25")), 3.0) == Decimal("0.25")


def test_the_measured_basis_without_figures_charges_the_allocation() -> None:
    assert charge_share(Decimal("0.5"), Basis("measured", Decimal("0.1")), None) == Decimal("0.5")
