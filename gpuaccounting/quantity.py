"""Kubernetes resource quantities ("1", "500m", "16Gi", "1e3") parsed exactly with the standard library, by
Kubernetes' own grammar (k8s.io/apimachinery/pkg/api/resource); JSON numbers too, as the API server does."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Final

_QUANTITY: Final = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$"
)

_SUFFIX_MULTIPLIERS: Final[dict[str, Decimal]] = {
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


_LARGEST: Final = Decimal(2**63 - 1)
_SMALLEST_EXPONENT: Final = -9
# Kubernetes writes a quantity in at most 19 integer digits, 9 decimals and a suffix; 64 characters leave
# room for other spellings (leading zeros, an exponent). A longer string is no quantity, and reading it
# would cost time quadratic in its length (a 400,000-digit value took seconds).
LONGEST: Final = 64


class QuantityError(ValueError):
    """The value is not a Kubernetes quantity."""


def shorten(text: str, limit: int = LONGEST) -> str:
    """`text` cut to `limit` characters, for messages that echo what a user sent."""
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def parse_quantity(value: object) -> Decimal:
    """Return the exact value of a quantity given as a string or a JSON number."""
    return _bounded(_parse(value), value)


def parse_decimal(value: object) -> Decimal:
    """A plain decimal number (a label or annotation such as "0.125"), in the same bounds as a quantity."""
    text = str(value).strip()
    if len(text) > LONGEST:
        raise QuantityError(
            f"{shorten(repr(value))} is longer than any Kubernetes quantity ({LONGEST} characters)"
        )
    try:
        amount = Decimal(text)
    except ArithmeticError:
        raise QuantityError(f"{value!r} is not a decimal number") from None
    if not amount.is_finite():
        raise QuantityError(f"{value!r} is not a finite number")
    return _bounded(amount, value)


def _bounded(amount: Decimal, value: object) -> Decimal:
    """Kubernetes caps a quantity at 2^63-1 in magnitude and rounds below a nano; beyond either (1e400,
    2**80, 1e-999999) is no request a pod can make, and its exact fraction would be an integer of that many
    digits (a share that large does not even fit a float)."""
    if amount.copy_abs() > _LARGEST:
        raise QuantityError(f"{value!r} is beyond the largest Kubernetes quantity (±(2^63-1))")
    if amount and amount.adjusted() < _SMALLEST_EXPONENT:
        raise QuantityError(f"{value!r} is smaller than the smallest Kubernetes quantity (1n)")
    return amount


def _parse(value: object) -> Decimal:
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is a boolean, not a quantity")
    if isinstance(value, int):
        if abs(value) > _LARGEST:  # before Decimal(), whose conversion grows with the digits
            raise QuantityError(
                f"{shorten(repr(value))} is beyond the largest Kubernetes quantity (±(2^63-1))"
            )
        return Decimal(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"{value!r} is not a finite quantity")
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is neither a string nor a number")
    if len(value) > LONGEST:
        raise QuantityError(
            f"{shorten(repr(value))} is longer than any Kubernetes quantity ({LONGEST} characters)"
        )
    match = _QUANTITY.match(value)
    if match is None:
        raise QuantityError(f"{value!r} is not a Kubernetes quantity")
    number, exponent, suffix = match.groups()
    amount = Decimal(number)
    if exponent is not None:
        try:
            return amount.scaleb(int(exponent))
        except (ArithmeticError, ValueError):  # an exponent beyond Decimal's range or int's digit limit
            raise QuantityError(f"{value!r} has an exponent out of range") from None
    if suffix is not None:
        return amount * _SUFFIX_MULTIPLIERS[suffix]
    return amount
