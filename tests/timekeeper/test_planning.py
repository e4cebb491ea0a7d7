"""The ingest plan, without a database: what each report charges by period, what the running totals gain,
and which namespaces' figures the batch's totals move."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from gpuaccounting.admission_state import default_priority_policy
from tests.support.timekeeper import report_body
from timekeeper.domain.figures import BudgetConfig, NamespaceFigures
from timekeeper.domain.periods import PeriodKind
from timekeeper.usage.planning import PlanInputs, Rate, figures_after, plan_charge, plan_report, plan_totals
from timekeeper.usage.schemas import ReportIn

MIDNIGHT = datetime(2026, 3, 19, tzinfo=UTC)


def config(period: PeriodKind) -> BudgetConfig:
    return BudgetConfig(
        budget_gpu_minutes=Decimal(100),
        period=period,
        warn_at_fraction=Decimal("0.8"),
        max_gpu_share_per_pod=None,
        concurrent_gpu_limit=None,
        explicit=True,
        priority_policy=default_priority_policy(),
        running_pod_action="none",
        own_priority_policy=False,
        own_running_pod_action=False,
    )


def report(namespace: str, pod_uid: str, start: datetime, minutes: float, share: float) -> ReportIn:
    body = report_body(namespace=namespace, pod_uid=pod_uid, start=start, minutes=minutes, gpu_share=share)
    return ReportIn.model_validate(body)


def rate(report: ReportIn) -> Rate:
    """The pod's rate at the share its report states (what the ingest service hands the planner is the
    admitted share; the planner charges whatever rate it is given)."""
    return Rate(report.gpu_share)


def test_a_charge_is_the_uncovered_time_split_at_the_period_boundary() -> None:
    spanning = report("daily", "uid-a", MIDNIGHT - timedelta(minutes=10), 20, 0.5)
    uncovered = [(MIDNIGHT - timedelta(minutes=10), MIDNIGHT - timedelta(minutes=4))]
    uncovered.append((MIDNIGHT, MIDNIGHT + timedelta(minutes=10)))

    [(before, early), (after, late)] = plan_charge(
        rate(spanning), uncovered, config(PeriodKind.DAILY).period
    ).by_period

    assert (before.start, early) == (MIDNIGHT - timedelta(days=1), Decimal(3))
    assert (after.start, late) == (MIDNIGHT, Decimal(5))


def test_a_report_is_planned_at_the_share_given_and_told_where_a_sidecar_stated_another() -> None:
    stated = report("team-a", "uid-a", MIDNIGHT + timedelta(hours=1), 10, 2)
    uncovered = [(stated.interval_start, stated.interval_end)]

    def planned(from_sidecar: bool) -> tuple[Decimal, Decimal, bool]:
        inputs = PlanInputs({"team-a": PeriodKind.DAILY}, {}, {}, False, from_sidecar)
        plan = plan_report(stated, Decimal("0.5"), uncovered, None, inputs)
        return plan.share, plan.charge.gpu_minutes, plan.differs

    assert planned(from_sidecar=True) == (Decimal("0.5"), Decimal(5), True)
    assert planned(from_sidecar=False) == (Decimal("0.5"), Decimal(5), False)  # silent time states none


def test_totals_gain_each_namespace_and_period_once_in_key_order() -> None:
    reports = [
        report("team-b", "uid-b", MIDNIGHT + timedelta(hours=1), 10, 1),
        report("team-a", "uid-a1", MIDNIGHT + timedelta(hours=1), 10, 1),
        report("team-a", "uid-a2", MIDNIGHT + timedelta(hours=1), 10, 2),
    ]
    configs = {"team-a": config(PeriodKind.MONTHLY), "team-b": config(PeriodKind.DAILY)}

    totals = plan_totals(
        (r.namespace, plan_charge(rate(r), [(r.interval_start, r.interval_end)], configs[r.namespace].period))
        for r in reports
    )

    assert list(totals.items()) == [
        (("team-a", "monthly", datetime(2026, 3, 1, tzinfo=UTC)), Decimal(30)),
        (("team-b", "daily", MIDNIGHT), Decimal(10)),
    ]


def test_only_a_total_of_the_current_period_moves_a_namespaces_figures() -> None:
    figures = {
        ns: NamespaceFigures(ns, config(PeriodKind.DAILY), Decimal(1), Decimal(0)) for ns in ("now", "past")
    }
    totals = [
        (("now", "daily", MIDNIGHT), Decimal(90), Decimal(5)),
        (("past", "daily", MIDNIGHT - timedelta(days=1)), Decimal(500), Decimal(0)),
    ]

    after = figures_after(figures, totals, MIDNIGHT + timedelta(hours=3))

    assert (after["now"].used_gpu_minutes, after["now"].granted_gpu_minutes) == (Decimal(90), Decimal(5))
    assert after["past"] == figures["past"]


def test_a_models_total_of_the_current_period_joins_the_others() -> None:
    """Per-model totals move only the current period's model figures, the other models kept, with or
    without the namespace's own total in the batch."""
    h100, a100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"
    figures = {
        ns: NamespaceFigures(ns, config(PeriodKind.DAILY), Decimal(1), Decimal(2), {a100: Decimal(3)})
        for ns in ("both", "models", "past")
    }
    totals = [(("both", "daily", MIDNIGHT), Decimal(90), Decimal(5))]
    model_totals = [
        (("both", "daily", MIDNIGHT, h100), Decimal(40)),
        (("models", "daily", MIDNIGHT, a100), Decimal(7)),
        (("models", "daily", MIDNIGHT, h100), Decimal(8)),
        (("past", "daily", MIDNIGHT - timedelta(days=1), h100), Decimal(500)),
    ]

    after = figures_after(figures, totals, MIDNIGHT + timedelta(hours=3), model_totals)

    assert after["both"] == NamespaceFigures(
        "both", config(PeriodKind.DAILY), Decimal(90), Decimal(5), {a100: Decimal(3), h100: Decimal(40)}
    )
    assert after["models"] == NamespaceFigures(
        "models", config(PeriodKind.DAILY), Decimal(1), Decimal(2), {a100: Decimal(7), h100: Decimal(8)}
    )
    assert after["past"] == figures["past"]
