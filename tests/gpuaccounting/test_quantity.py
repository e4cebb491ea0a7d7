"""Kubernetes quantities parse exactly, in every form the API server accepts, and nothing else does."""

from decimal import Decimal

import pytest

from gpuaccounting.quantity import QuantityError, parse_decimal, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", Decimal(1)),
        ("500m", Decimal("0.5")),
        ("1000m", Decimal(1)),
        ("16Gi", Decimal(16 * 2**30)),
        ("256Mi", Decimal(256 * 2**20)),
        ("1k", Decimal(1000)),
        ("2M", Decimal(2_000_000)),
        ("1E", Decimal(10**18)),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("5e-1", Decimal("0.5")),
        ("0.25", Decimal("0.25")),
        (".5", Decimal("0.5")),
        ("2.", Decimal(2)),
        ("+3", Decimal(3)),
        ("100u", Decimal("0.0001")),
        ("7n", Decimal("7e-9")),
    ],
)
def test_string_quantities_parse_exactly(text: str, expected: Decimal) -> None:
    assert parse_quantity(text) == expected


def test_json_numbers_are_quantities() -> None:
    assert parse_quantity(4) == 4
    assert parse_quantity(0.5) == Decimal("0.5")


@pytest.mark.parametrize(
    "value", ["", "abc", "1.5.2", "1KiB", "1e", "Gi", "1 Gi", "0x10", " 1", True, None, [1], {}]
)
def test_everything_else_is_refused(value: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)


def test_non_finite_numbers_are_refused() -> None:
    with pytest.raises(QuantityError):
        parse_quantity(float("nan"))
    with pytest.raises(QuantityError):
        parse_quantity(float("inf"))


def test_a_string_longer_than_any_kubernetes_quantity_is_refused_unread() -> None:
    """A 400,000-digit value once took seconds to turn into a fraction; now its length refuses it."""
    within_nano = "0." + "0" * 8 + "1" * 400_000
    with pytest.raises(QuantityError, match="longer than any Kubernetes quantity"):
        parse_quantity(within_nano)
    with pytest.raises(QuantityError, match="longer than any Kubernetes quantity"):
        parse_decimal(within_nano)
    assert parse_quantity("0" * 53 + "1.000000001") == Decimal("1.000000001")  # 64 characters


def test_an_integer_beyond_int64_is_refused_before_conversion() -> None:
    with pytest.raises(QuantityError, match="beyond the largest"):
        parse_quantity(10**4000)
