"""What a GPU-minute on each GPU model counts for, over time: a weight applies from `effective_from`
until the model's next change, an unweighted model counts 1. The SQL function `gpu_weighted_seconds` is
the same rule (tests/timekeeper/test_billing_weights.py holds the two side by side)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Literal

# model_key's home is gpuaccounting.gpumodels (the webhook compares models too); re-exported for the
# timekeeper's callers.
from gpuaccounting.gpumodels import model_key as model_key

ONE = Decimal(1)


@dataclass(frozen=True, slots=True)
class WeightChange:
    effective_from: datetime
    weight: Decimal


@dataclass(frozen=True, slots=True)
class WeightTimeline:
    """One model's weight changes in time order; 1 before the first. Charging uses
    `weighted_microseconds`, in integers, so splitting a report at weight changes stays exact."""

    changes: tuple[WeightChange, ...] = ()
    _starts: tuple[datetime, ...] = field(init=False, repr=False, compare=False)
    _units: tuple[int, ...] = field(init=False, repr=False, compare=False)
    scale: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        scale = max((_decimals(change.weight) for change in self.changes), default=0)
        object.__setattr__(self, "_starts", tuple(change.effective_from for change in self.changes))
        object.__setattr__(self, "_units", tuple(int(change.weight.scaleb(scale)) for change in self.changes))
        object.__setattr__(self, "scale", scale)

    def weight_at(self, moment: datetime) -> Decimal:
        at = bisect_right(self._starts, moment)
        return self.changes[at - 1].weight if at else ONE

    def pieces(self, lower: datetime, upper: datetime) -> list[tuple[datetime, datetime, Decimal]]:
        """[lower, upper) cut where the weight changes, each piece with its weight (a binary search, then
        the changes inside: a long weight history costs a batch little)."""
        first = bisect_right(self._starts, lower)
        weight = self.changes[first - 1].weight if first else ONE
        pieces = []
        start = lower
        for change in self.changes[first:]:
            if change.effective_from >= upper:
                break
            pieces.append((start, change.effective_from, weight))
            start, weight = change.effective_from, change.weight
        pieces.append((start, upper, weight))
        return pieces

    def weighted_microseconds(self, lower: datetime, upper: datetime) -> int:
        """Σ weight x µs over [lower, upper), in 10^-scale weight-µs: the weight of each piece as `pieces`
        cuts them, exactly (`Decimal(n).scaleb(-scale)` is the sum in weight-µs)."""
        starts = self._starts
        first = bisect_right(starts, lower)
        if first == len(starts):  # no change inside (the common case): one product
            return (self._units[first - 1] if first else 10**self.scale) * microseconds(upper - lower)
        total, start, unit = 0, lower, self._units[first - 1] if first else 10**self.scale
        for at in range(first, len(starts)):
            if starts[at] >= upper:
                break
            total += unit * microseconds(starts[at] - start)
            start, unit = starts[at], self._units[at]
        return total + unit * microseconds(upper - start)


def _decimals(weight: Decimal) -> int:
    exponent = weight.as_tuple().exponent
    assert isinstance(exponent, int), "a weight is a finite number (the table's check)"
    return max(0, -exponent)


def microseconds(delta: timedelta) -> int:
    """A duration in whole microseconds, exactly (timedelta's own resolution)."""
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


UNWEIGHTED = WeightTimeline()


def timelines(rows: Iterable[tuple[str, datetime, Decimal]]) -> dict[str, WeightTimeline]:
    """(model, effective_from, weight) rows, in any order, as each model's timeline."""
    changes: dict[str, list[WeightChange]] = {}
    for model, effective_from, weight in rows:
        changes.setdefault(model, []).append(WeightChange(effective_from, weight))
    return {
        model: WeightTimeline(tuple(sorted(found, key=lambda change: change.effective_from)))
        for model, found in changes.items()
    }


def timeline_of(model: str | None, known: Mapping[str, WeightTimeline]) -> WeightTimeline:
    return UNWEIGHTED if model is None else known.get(model, UNWEIGHTED)


ChargeBasisKind = Literal["allocation", "measured"]
_PERCENT = Decimal("0.01")
_HUNDRED = Decimal(100)


@dataclass(frozen=True, slots=True)
class Basis:
    """How a pod's time is charged: its allocation, or its allocation x max(floor, mean SM utilisation)."""

    kind: ChargeBasisKind
    floor: Decimal


SHIPPED_BASIS = Basis("allocation", Decimal("0.1"))


def charge_share(gpu_share: Decimal, basis: Basis, mean_sm_util_pct: float | None) -> Decimal:
    """What one second of the pod's time is charged, before its GPU's weight. Utilisation counts in whole
    percent (so the hourly roll-up still folds a pod's reports into few rows); a pod without measurements is
    charged its allocation."""
    if basis.kind == "allocation" or mean_sm_util_pct is None:
        return gpu_share
    measured = (Decimal(str(mean_sm_util_pct)) / _HUNDRED).quantize(_PERCENT, rounding=ROUND_HALF_UP)
    return gpu_share * min(ONE, max(basis.floor, measured))


CLUSTER_SCOPE = "*"  # the charge_basis row every namespace without its own follows; no namespace is named so


def resolve_basis(namespace: str, rows: Mapping[str, tuple[str, Decimal]]) -> tuple[Basis, str]:
    """The namespace's own basis, else the cluster's, else the shipped one (allocation); and which."""
    for scope, source in ((namespace, "namespace"), (CLUSTER_SCOPE, "cluster")):
        if scope in rows:
            kind, floor = rows[scope]
            return Basis(kind, floor), source  # type: ignore[arg-type]  # the table's check holds kind
    return SHIPPED_BASIS, "shipped"
