"""The priority policy as a pure decision: every rule of gpuaccounting.admission_state's docstring, with
the cluster's PriorityClasses as the watch would have listed them."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gpuaccounting.wire import BudgetState
from tests.support.admission_state_server import entry
from webhook.decisions.priority import DecisionRecorder, PriorityDecider, PriorityDecision, PriorityRule
from webhook.metrics import WebhookMetrics
from webhook.settings import WebhookSettings
from webhook.watches.budgetcache import Freshness, NamespaceView
from webhook.watches.priorityclasses import PriorityClassCatalog, PriorityClassInfo

# A cluster as issue 12 found it: a globalDefault class above ours, a user's high class, a low one.
CLUSTER = (
    PriorityClassInfo("gpu-in-budget", 1000, "PreemptLowerPriority", False),
    PriorityClassInfo("gpu-over-budget", 100, "Never", False),
    PriorityClassInfo("default-batch", 5000, "PreemptLowerPriority", True),
    PriorityClassInfo("high", 100000, "PreemptLowerPriority", False),
    PriorityClassInfo("low", 500, "Never", False),
    PriorityClassInfo("system-node-critical", 2000001000, "PreemptLowerPriority", False),
)
SETTINGS = WebhookSettings(watch_priority_classes=False)


def catalog(*classes: PriorityClassInfo) -> PriorityClassCatalog:
    listed = PriorityClassCatalog()
    listed.replace_all(classes or CLUSTER)
    return listed


def view(state: BudgetState = "in_budget", freshness: Freshness = "fresh", **policy: Any) -> NamespaceView:
    return NamespaceView(entry(state, **policy), freshness, 0.0)


NEVER_LOADED = NamespaceView(None, "missing", None)


def decide(
    arrived: str | None,
    namespace: NamespaceView,
    classes: PriorityClassCatalog | None = None,
    settings: WebhookSettings = SETTINGS,
    name: str = "team-a",
) -> PriorityDecision:
    spec = {} if arrived is None else {"priorityClassName": arrived, "priority": 7}
    return PriorityDecider(settings, classes or catalog()).decide(spec, namespace, namespace=name)


def outcome(decision: PriorityDecision) -> tuple[PriorityRule, str | None, int | None, str | None]:
    return decision.rule, decision.class_name, decision.priority, decision.preemption_policy


REDUCED = ("gpu-over-budget", 100, "Never")
IN_BUDGET = ("gpu-in-budget", 1000, "PreemptLowerPriority")


# ---- exhausted: every GPU pod gets the reduced class, exempt classes aside ---------------------------------


def test_global_default_class_in_an_exhausted_namespace_gets_the_reduced_class() -> None:
    decision = decide("default-batch", view("exhausted"))
    assert outcome(decision) == (PriorityRule.EXHAUSTED, *REDUCED)
    assert decision.annotation == "exhausted: namespace exhausted; globalDefault class default-batch replaced"


def test_user_class_in_an_exhausted_namespace_gets_the_reduced_class() -> None:
    decision = decide("high", view("exhausted"))
    assert outcome(decision) == (PriorityRule.EXHAUSTED, *REDUCED)
    assert decision.annotation == "exhausted: namespace exhausted; class high replaced"


def test_even_a_user_class_below_the_reduced_one_is_replaced_when_exhausted() -> None:
    # One rule, no exceptions: the reduced class is what exhausted namespaces' pods run at.
    assert outcome(decide("low", view("exhausted", ceiling=10**9))) == (PriorityRule.EXHAUSTED, *REDUCED)


def test_pod_without_a_class_in_an_exhausted_namespace_gets_the_reduced_class() -> None:
    decision = decide(None, view("exhausted"))
    assert outcome(decision) == (PriorityRule.EXHAUSTED, *REDUCED)
    assert decision.budget_state == "exhausted"


@pytest.mark.parametrize("state", ["exhausted", "in_budget", "warning", "unlimited"])
@pytest.mark.parametrize("name", ["kube-system", "gpu-timekeeper"])
def test_an_exempt_class_is_kept_in_every_state_where_it_is_exempt(state: BudgetState, name: str) -> None:
    decision = decide("system-node-critical", view(state), name=name)
    assert outcome(decision) == (PriorityRule.EXEMPT, None, None, None)
    assert decision.annotation == "exempt: class system-node-critical is exempt"


def test_a_critical_class_elsewhere_is_governed_like_a_users_class() -> None:
    """Issue 25: system-*-critical on a GPU pod escaped an exhausted budget in any namespace."""
    for critical in ("system-node-critical", "system-cluster-critical"):
        exhausted = decide(critical, view("exhausted"))
        assert outcome(exhausted) == (PriorityRule.EXHAUSTED, *REDUCED)
        assert exhausted.annotation == f"exhausted: namespace exhausted; class {critical} replaced"
        assert decide(critical, view()).rule == PriorityRule.USER_CLASS_ABOVE_CEILING


def test_exempt_namespaces_are_listed_per_class() -> None:
    settings = WebhookSettings(
        watch_priority_classes=False,
        exempt_namespaces={"system-node-critical": ["infra"], "*": ["kube-system"]},
    )
    assert decide("system-node-critical", view("exhausted"), settings=settings, name="infra").rule == (
        PriorityRule.EXEMPT
    )
    assert decide("system-node-critical", view("exhausted"), settings=settings, name="kube-system").rule == (
        PriorityRule.EXHAUSTED
    )
    assert decide(
        "system-cluster-critical", view("exhausted"), settings=settings, name="kube-system"
    ).rule == (PriorityRule.EXEMPT)
    assert decide("system-cluster-critical", view("exhausted"), settings=settings, name="infra").rule == (
        PriorityRule.EXHAUSTED
    )


def test_exempt_namespaces_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEBHOOK_EXEMPT_NAMESPACES", '{"*": ["kube-system", "ops"]}')
    assert WebhookSettings().exempt_namespaces == {"*": {"kube-system", "ops"}}


def test_the_exempt_list_is_the_namespaces_own() -> None:
    custom = view("exhausted", exempt_classes=["high"])
    assert decide("high", custom, name="kube-system").rule == PriorityRule.EXEMPT
    assert decide("system-node-critical", custom, name="kube-system").rule == PriorityRule.EXHAUSTED


# ---- in budget ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["in_budget", "warning", "unlimited"])
def test_no_class_or_the_global_default_class_gets_the_in_budget_class(state: BudgetState) -> None:
    assert outcome(decide(None, view(state))) == (PriorityRule.IN_BUDGET, *IN_BUDGET)
    filled_in = decide("default-batch", view(state))
    assert outcome(filled_in) == (PriorityRule.IN_BUDGET, *IN_BUDGET)
    assert filled_in.annotation == "in-budget: no class chosen; globalDefault class default-batch replaced"


def test_user_class_above_the_ceiling_gets_the_in_budget_class() -> None:
    decision = decide("high", view())
    assert outcome(decision) == (PriorityRule.USER_CLASS_ABOVE_CEILING, *IN_BUDGET)
    assert (
        decision.annotation
        == "user-class-above-ceiling: class high (100000) above the ceiling 1000, replaced"
    )


def test_user_class_at_or_below_the_ceiling_is_kept() -> None:
    low = decide("low", view())
    assert outcome(low) == (PriorityRule.USER_CLASS_KEPT, None, None, None)
    assert low.annotation == "user-class-kept: class low (500) at or below the ceiling 1000"
    at = PriorityClassInfo("at-ceiling", 1000, "PreemptLowerPriority", False)
    assert decide("at-ceiling", view(), catalog(*CLUSTER, at)).rule == PriorityRule.USER_CLASS_KEPT
    above = PriorityClassInfo("just-above", 1001, "PreemptLowerPriority", False)
    assert (
        decide("just-above", view(), catalog(*CLUSTER, above)).rule == PriorityRule.USER_CLASS_ABOVE_CEILING
    )


def test_an_explicit_ceiling_replaces_the_in_budget_value() -> None:
    assert decide("high", view(ceiling=100000)).rule == PriorityRule.USER_CLASS_KEPT
    assert decide("low", view(ceiling=499)).rule == PriorityRule.USER_CLASS_ABOVE_CEILING


def test_a_null_ceiling_is_the_in_budget_class_objects_own_value() -> None:
    raised = catalog(
        PriorityClassInfo("gpu-in-budget", 200000, "PreemptLowerPriority", False),
        *(c for c in CLUSTER if c.name != "gpu-in-budget"),
    )
    decision = decide("high", view(), raised)
    assert decision.rule == PriorityRule.USER_CLASS_KEPT
    assert decision.reason == "class high (100000) at or below the ceiling 200000"
    assert decide(None, view(), raised).priority == 200000  # and that value is what is written


def test_a_class_of_unknown_value_counts_as_above_the_ceiling() -> None:
    decision = decide("made-up", view(ceiling=10**9))
    assert outcome(decision) == (PriorityRule.USER_CLASS_ABOVE_CEILING, *IN_BUDGET)
    assert decision.reason == "class made-up (unknown value) above the ceiling 1000000000, replaced"


def test_replace_gives_every_user_class_the_in_budget_class() -> None:
    for arrived in ("low", "high"):
        decision = decide(arrived, view(user_classes="replace"))
        assert outcome(decision) == (PriorityRule.USER_CLASS_REPLACED, *IN_BUDGET)
    assert decide("low", view(user_classes="replace")).reason == "class low replaced (user classes: replace)"
    # The exempt list still wins under `replace`, where it applies.
    replace = view(user_classes="replace")
    assert decide("system-node-critical", replace, name="kube-system").rule == PriorityRule.EXEMPT


def test_our_own_classes_count_as_no_class_chosen() -> None:
    # They are the webhook's outputs: a user naming gpu-in-budget in an exhausted namespace gains nothing.
    assert outcome(decide("gpu-in-budget", view("exhausted"))) == (PriorityRule.EXHAUSTED, *REDUCED)
    assert outcome(decide("gpu-over-budget", view())) == (PriorityRule.IN_BUDGET, *IN_BUDGET)


# ---- the numbers written are the objects' own --------------------------------------------------------------


def test_our_classes_numbers_come_from_the_objects_and_the_settings_only_before_the_first_list() -> None:
    listed = catalog(
        PriorityClassInfo("gpu-in-budget", 1500, "Never", False),
        PriorityClassInfo("gpu-over-budget", 50, "PreemptLowerPriority", False),
    )
    assert outcome(decide(None, view(), listed))[1:] == ("gpu-in-budget", 1500, "Never")
    assert outcome(decide(None, view("exhausted"), listed))[1:] == (
        "gpu-over-budget",
        50,
        "PreemptLowerPriority",
    )
    assert outcome(decide(None, view(), PriorityClassCatalog()))[1:] == IN_BUDGET


def test_without_the_watch_only_an_absent_class_is_no_class_chosen() -> None:
    """Nothing tells the globalDefault class from a user's: it is a user class of unknown value, so it
    still ends with the in-budget class in budget and the reduced one when exhausted."""
    unlisted = PriorityClassCatalog()
    in_budget = decide("default-batch", view(), unlisted)
    assert outcome(in_budget) == (PriorityRule.USER_CLASS_ABOVE_CEILING, *IN_BUDGET)
    assert outcome(decide("default-batch", view("exhausted"), unlisted)) == (PriorityRule.EXHAUSTED, *REDUCED)


# ---- stale and missing state -------------------------------------------------------------------------------


def test_stale_state_decides_with_the_last_known_state() -> None:
    stale = decide("default-batch", view("exhausted", freshness="stale"))
    assert outcome(stale) == (PriorityRule.EXHAUSTED, *REDUCED)
    assert (stale.freshness, stale.budget_state) == ("stale", "exhausted")
    assert stale.reason.endswith("; stale state, last known exhausted")
    assert decide("high", view("in_budget", freshness="stale")).rule == PriorityRule.USER_CLASS_ABOVE_CEILING


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("in_budget", (PriorityRule.IN_BUDGET, *IN_BUDGET)),
        ("over_budget", (PriorityRule.EXHAUSTED, *REDUCED)),
    ],
)
def test_never_loaded_state_follows_the_missing_state_policy(policy: str, expected: tuple[Any, ...]) -> None:
    settings = WebhookSettings(watch_priority_classes=False, missing_state_policy=policy)
    decision = decide(None, NEVER_LOADED, settings=settings)
    assert outcome(decision) == expected
    assert (decision.freshness, decision.budget_state) == ("missing", None)
    assert decision.reason.endswith(f"; state never loaded, missing-state policy {policy}")


def test_never_loaded_state_uses_the_default_priority_policy() -> None:
    assert decide("system-node-critical", NEVER_LOADED, name="kube-system").rule == PriorityRule.EXEMPT
    assert decide("low", NEVER_LOADED).rule == PriorityRule.USER_CLASS_KEPT
    assert decide("high", NEVER_LOADED).rule == PriorityRule.USER_CLASS_ABOVE_CEILING


# ---- re-invocation -----------------------------------------------------------------------------------------


def test_a_reinvoked_pod_keeps_the_words_of_the_decision_that_set_its_class() -> None:
    policy = PriorityDecider(SETTINGS, catalog())
    first = policy.decide({"priorityClassName": "high"}, view(), namespace="team-a")
    spec: dict[str, Any] = {"priorityClassName": "high"}
    first.apply(spec)
    again = policy.decide(spec, view(), first.annotation, namespace="team-a")
    assert (again.rule, again.annotation, again.class_name) == (first.rule, first.annotation, "gpu-in-budget")


def test_a_previous_decision_that_set_another_class_is_not_kept() -> None:
    policy = PriorityDecider(SETTINGS, catalog())
    # The namespace ran out between the two passes: the reduced class, and the words of now.
    exhausted = policy.decide(
        {"priorityClassName": "gpu-in-budget"},
        view("exhausted"),
        "user-class-above-ceiling: earlier",
        namespace="team-a",
    )
    assert (exhausted.rule, exhausted.class_name) == (PriorityRule.EXHAUSTED, "gpu-over-budget")
    # A user's own annotation cannot give a kept class to a pod that arrived with ours.
    forged = policy.decide(
        {"priorityClassName": "gpu-in-budget"}, view(), "exempt: class x is exempt", namespace="team-a"
    )
    assert forged.rule == PriorityRule.IN_BUDGET
    assert (
        policy.decide({"priorityClassName": "gpu-in-budget"}, view(), "garbage", namespace="team-a").rule
        == PriorityRule.IN_BUDGET
    )


# ---- counting and logging (the caller's, skipped for dryRun) -----------------------------------------------


def test_the_recorder_counts_by_rule_and_logs_each_outage_once(caplog: pytest.LogCaptureFixture) -> None:
    metrics = WebhookMetrics(lambda: None)
    recorder = DecisionRecorder(metrics)
    caplog.set_level(logging.WARNING, logger="webhook.priority")

    def count(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    for _ in range(3):
        recorder.record(decide("high", view("exhausted", freshness="stale")))
    recorder.record(decide(None, NEVER_LOADED))
    assert count("webhook_state_stale_decisions_total") == 3
    assert count("webhook_state_missing_decisions_total") == 1
    assert count("webhook_priority_decisions_total", rule="exhausted") == 3
    assert [r.message for r in caplog.records] == ["admission_state_stale", "admission_state_missing"]
    recorder.record(decide(None, view()))  # fresh in between: the next outage is logged again
    recorder.record(decide(None, view(freshness="stale")))
    assert [r.message for r in caplog.records][-1] == "admission_state_stale"
    assert len(caplog.records) == 3
    assert count("webhook_priority_decisions_total", rule="in-budget") == 3
