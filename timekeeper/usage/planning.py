"""What a batch of reports charges, decided without the database: given each pod's time not yet charged
and each namespace's budget, the charge of every report split by period, and what the running totals
gain. Pure, so the rules are tested alone; the ingest service reads the inputs and writes the plan."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from timekeeper.domain.figures import ModelTotalKey, NamespaceFigures, TotalKey
from timekeeper.domain.periods import Interval, Period, PeriodKind, period_containing
from timekeeper.domain.weights import UNWEIGHTED, WeightTimeline, charge_share, resolve_basis, timeline_of
from timekeeper.usage.charging import split_charge
from timekeeper.usage.measure import Measured, measure
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
    """What a second of a pod's time is charged: its charge share (domain.weights.charge_share) times
    the weight of its GPU model at that second."""

    charge_share: Decimal
    weights: WeightTimeline = UNWEIGHTED


@dataclass(frozen=True, slots=True)
class ReportPlan:
    """What one new report charges: the share it is charged at, its measured figures, its rate and its
    charge by period; `differs`: the report (a sidecar's) states another share than that one."""

    share: Decimal
    measured: Measured
    rate: Rate
    charge: ReportCharge
    differs: bool
    # The raw GPU-minutes of the same time (the share, no basis, no weight): what its GPU model's budget
    # counts.
    raw: ReportCharge = ReportCharge(())


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """What every report of a batch is planned with: its namespaces' periods, the charge bases and GPU
    model weights read with it, and whether reports' utilisation is believed and come from sidecars."""

    periods: Mapping[str, PeriodKind]  # by namespace
    bases: Mapping[str, tuple[str, Decimal]]
    weights: Mapping[str, WeightTimeline]
    utilisation_trusted: bool
    from_sidecar: bool


def plan_report(
    report: ReportIn,
    share: Decimal,
    uncovered: Sequence[Interval],
    model: str | None,
    inputs: PlanInputs,
) -> ReportPlan:
    """A report's plan: its rate (its charge share, of the share its pod was admitted at, never the one
    the report states, x its GPU model's weight) times the time of its interval not yet charged, split at
    its namespace's period boundaries. A report whose utilisation is not believed is charged as one
    without figures: by allocation."""
    measured = measure(report)
    rate = Rate(
        charge_share(
            share,
            resolve_basis(report.namespace, inputs.bases)[0],
            measured.mean_sm_util_pct if inputs.utilisation_trusted else None,
        ),
        timeline_of(model, inputs.weights),
    )
    period = inputs.periods[report.namespace]
    charge = plan_charge(rate, uncovered, period)
    raw = plan_charge(Rate(share), uncovered, period)
    return ReportPlan(share, measured, rate, charge, inputs.from_sidecar and share != report.gpu_share, raw)


def plan_charge(rate: Rate, uncovered: Sequence[Interval], period: PeriodKind) -> ReportCharge:
    """A report's charge at its pod's rate: the time of its interval not yet charged, split at its
    namespace's period boundaries."""
    return ReportCharge(tuple(split_charge(rate.charge_share, uncovered, period, rate.weights)))


def plan_totals(charges: Iterable[tuple[str, ReportCharge]]) -> dict[TotalKey, Decimal]:
    """What the running totals gain from the charges (each with its namespace), one entry per (namespace,
    period), in key order (the order every writer locks totals in)."""
    added: dict[TotalKey, Decimal] = defaultdict(Decimal)
    for namespace, charge in charges:
        for period, amount in charge.by_period:
            added[(namespace, period.kind.value, period.start)] += amount
    return dict(sorted(added.items()))


def plan_model_totals(charges: Iterable[tuple[str, str, ReportCharge]]) -> dict[ModelTotalKey, Decimal]:
    """What the per-model totals gain from the raw charges (each with its namespace and the GPU model
    its pod is known by now, UNKNOWN_MODEL when none), in key order (the lock order). A pod's minutes
    count under the model known when they are charged: one whose model becomes known later keeps its
    earlier minutes where they were counted (unknown, or the first model known)."""
    added: dict[ModelTotalKey, Decimal] = defaultdict(Decimal)
    for namespace, model, charge in charges:
        for period, amount in charge.by_period:
            added[(namespace, period.kind.value, period.start, model)] += amount
    return dict(sorted(added.items()))


def figures_after(
    figures: Mapping[str, NamespaceFigures],
    totals: Iterable[tuple[TotalKey, Decimal, Decimal]],
    now: datetime,
    model_totals: Iterable[tuple[ModelTotalKey, Decimal]] = (),
) -> dict[str, NamespaceFigures]:
    """The namespaces' figures once the batch's charges are added: a total written by the batch (its
    (used, granted) as the database answered, other batches' charges included) replaces the one read
    before, where it is the namespace's current period; a charge to a past period changes no state. The
    same for each model's total. Each namespace's figures are made once, directly: dataclasses.replace,
    twice a namespace, was a measurable share of a batch's CPU (bench/RESULTS.md, Profiles)."""
    current = {
        namespace: period_containing(found.config.period, now).start for namespace, found in figures.items()
    }
    used: dict[str, tuple[Decimal, Decimal]] = {}
    for (namespace, _, start), total, granted in totals:
        if start == current[namespace]:
            used[namespace] = (total, granted)
    models: dict[str, dict[str, Decimal]] = {}
    for (namespace, _, start, model), total in model_totals:
        if start == current[namespace]:
            models.setdefault(namespace, {})[model] = total
    after = dict(figures)
    for namespace in used.keys() | models.keys():
        before = figures[namespace]
        total, granted = used.get(namespace, (before.used_gpu_minutes, before.granted_gpu_minutes))
        after[namespace] = NamespaceFigures(
            namespace=namespace,
            config=before.config,
            used_gpu_minutes=total,
            granted_gpu_minutes=granted,
            model_used={**before.model_used, **models[namespace]}
            if namespace in models
            else before.model_used,
        )
    return after
