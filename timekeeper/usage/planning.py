"""What a batch of reports charges, decided without the database: given each pod's time not yet charged
and each namespace's budget, the charge of every report split by period, and what the running totals
gain. Pure, so the rules are tested alone; the ingest service reads the inputs and writes the plan."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal

from timekeeper.domain.figures import BudgetConfig, NamespaceFigures, TotalKey
from timekeeper.domain.periods import Interval, Period, period_containing
from timekeeper.domain.weights import UNWEIGHTED, WeightTimeline
from timekeeper.usage.charging import split_charge
from timekeeper.usage.schemas import ReportIn


@dataclass(frozen=True, slots=True)
class ReportCharge:
    """One report's charge: the GPU-minutes of each period its uncovered time falls into."""

    by_period: tuple[tuple[Period, Decimal], ...]

    @property
    def gpu_minutes(self) -> Decimal:
        return sum((amount for _, amount in self.by_period), Decimal(0))


@dataclass(frozen=True, slots=True)
class Rate:
    """What a second of a pod's time is charged: its charge share (billing.weights.charge_share) times
    the weight of its GPU model at that second."""

    charge_share: Decimal
    weights: WeightTimeline = UNWEIGHTED


def plan_charges(
    reports: Sequence[ReportIn],
    uncovered: Mapping[str, Sequence[Interval]],
    configs: Mapping[str, BudgetConfig],
    rates: Mapping[str, Rate],
) -> dict[str, ReportCharge]:
    """Each report's charge (by pod_uid): its pod's rate (of the share it was admitted at, never the one
    the report states) times the time of its interval not yet charged, split at its namespace's period
    boundaries."""
    charges = {}
    for report in reports:
        rate = rates[report.pod_uid]
        split = split_charge(
            rate.charge_share, uncovered[report.pod_uid], configs[report.namespace].period, rate.weights
        )
        charges[report.pod_uid] = ReportCharge(tuple(split))
    return charges


def plan_totals(reports: Sequence[ReportIn], charges: Mapping[str, ReportCharge]) -> dict[TotalKey, Decimal]:
    """What the running totals gain from the reports charged, one entry per (namespace, period), in key
    order (the order every writer locks totals in)."""
    added: dict[TotalKey, Decimal] = defaultdict(Decimal)
    for report in reports:
        for period, amount in charges[report.pod_uid].by_period:
            added[(report.namespace, period.kind.value, period.start)] += amount
    return dict(sorted(added.items()))


def figures_after(
    figures: Mapping[str, NamespaceFigures],
    totals: Iterable[tuple[TotalKey, Decimal, Decimal]],
    now: datetime,
) -> dict[str, NamespaceFigures]:
    """The namespaces' figures once the batch's charges are added: a total written by the batch (its
    (used, granted) as the database answered, other batches' charges included) replaces the one read
    before, where it is the namespace's current period; a charge to a past period changes no state."""
    after = dict(figures)
    for (namespace, _, start), used, granted in totals:
        current = figures[namespace]
        if start == period_containing(current.config.period, now).start:
            after[namespace] = replace(current, used_gpu_minutes=used, granted_gpu_minutes=granted)
    return after
