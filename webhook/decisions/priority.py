"""Which PriorityClass a GPU pod gets: its namespace's priority policy (gpuaccounting.admission_state states
the rule) applied to the class it arrived with. `decide` is pure and returns the rule that applied; the
endpoint counts and logs it."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuaccounting.admission_state import (
    NamespaceAdmission,
    PriorityPolicy,
    default_priority_policy,
    is_exempt,
    is_over_budget,
)
from gpuaccounting.counters import start_at_zero
from gpuaccounting.gpumodels import model_key
from gpuaccounting.placement import Placement
from gpuaccounting.wire import BudgetState
from webhook.decisions.steering import can_steer, is_label_value
from webhook.metrics import WebhookMetrics
from webhook.settings import WebhookSettings
from webhook.watches.budgetcache import Freshness, NamespaceView
from webhook.watches.priorityclasses import DEFAULT_PREEMPTION_POLICY, PriorityClassCatalog
from webhook.watches.workloads import MODEL_EXHAUSTED_MARK, WORKLOAD_CLASS_KEPT, WorkloadClass

log = logging.getLogger("webhook.priority")


class PriorityRule(StrEnum):
    """The rule that applied; its value is the stable id the decision annotation starts with."""

    EXEMPT = "exempt"  # an exempt class in a namespace listed for it, kept in every state
    EXHAUSTED = "exhausted"  # any other class in an exhausted namespace: the reduced class
    MODEL_EXHAUSTED = "model-exhausted"  # in budget, but the pod can land on a model whose budget is spent
    STEERED = "steered"  # in budget, no class kept: steered off the exhausted models, the in-budget class
    IN_BUDGET = "in-budget"  # in budget, no class chosen (none, the globalDefault one, ours): in-budget
    USER_CLASS_REPLACED = "user-class-replaced"  # in budget, a user's class under `replace`
    USER_CLASS_KEPT = "user-class-kept"  # in budget, a user's class at or below the ceiling
    USER_CLASS_ABOVE_CEILING = "user-class-above-ceiling"  # in budget, above it (or of unknown value)
    WORKLOAD_CLASS_KEPT = WORKLOAD_CLASS_KEPT  # a later pod of a workload: its first pods' class, any state


# Which class each rule leaves the pod with: ours (in budget / reduced), or the one it arrived with.
_OUTCOME = {
    PriorityRule.EXEMPT: "kept",
    PriorityRule.USER_CLASS_KEPT: "kept",
    PriorityRule.EXHAUSTED: "reduced",
    PriorityRule.MODEL_EXHAUSTED: "reduced",
    PriorityRule.STEERED: "in_budget",
    PriorityRule.IN_BUDGET: "in_budget",
    PriorityRule.USER_CLASS_REPLACED: "in_budget",
    PriorityRule.USER_CLASS_ABOVE_CEILING: "in_budget",
    PriorityRule.WORKLOAD_CLASS_KEPT: "workload",
}


@dataclass(frozen=True, slots=True)
class PriorityDecision:
    rule: PriorityRule
    class_name: str | None  # None: the pod keeps the class it arrived with
    priority: int | None
    preemption_policy: str | None
    budget_state: BudgetState | None  # None: the state was never loaded
    freshness: Freshness
    reason: str  # the rule in words, stable for the same pod and state (the annotation is diffed)
    steer_off: tuple[str, ...] = ()  # exhausted models (node label spellings) /mutate steers the pod off

    @property
    def annotation(self) -> str:
        return f"{self.rule}: {self.reason}"

    def apply(self, spec: dict[str, Any]) -> None:
        if self.class_name is None:
            return
        spec["priorityClassName"] = self.class_name
        spec["priority"] = self.priority
        spec["preemptionPolicy"] = self.preemption_policy


@dataclass(frozen=True, slots=True)
class _Class:
    name: str
    value: int
    preemption_policy: str


class PriorityDecider:
    def __init__(self, settings: WebhookSettings, catalog: PriorityClassCatalog) -> None:
        self.settings = settings
        self.catalog = catalog
        self.ours = frozenset({settings.in_budget_priority_class, settings.over_budget_priority_class})

    def _ours(self, name: str, value: int, preemption_policy: str) -> _Class:
        """Our class with the object's own numbers once listed, the settings' before."""
        info = self.catalog.get(name)
        if info is None:
            return _Class(name, value, preemption_policy)
        return _Class(name, info.value, info.preemption_policy)

    def in_budget_class(self) -> _Class:
        s = self.settings
        return self._ours(s.in_budget_priority_class, s.in_budget_priority, s.in_budget_preemption_policy)

    def reduced_class(self) -> _Class:
        s = self.settings
        return self._ours(
            s.over_budget_priority_class, s.over_budget_priority, s.over_budget_preemption_policy
        )

    def _rule(
        self, arrived: str | None, namespace: str, exhausted: bool, policy: PriorityPolicy
    ) -> tuple[PriorityRule, str]:
        if is_exempt(arrived, namespace, policy["exempt_classes"], self.settings.exempt_namespaces):
            return PriorityRule.EXEMPT, f"class {arrived} is exempt"
        # Our own classes are the webhook's outputs (a re-invocation sees them), never a user's choice.
        no_class = arrived is None or arrived in self.ours
        default = not no_class and self.catalog.is_global_default(arrived or "")
        origin = "" if no_class else f"; {'globalDefault ' if default else ''}class {arrived} replaced"
        if exhausted:
            return PriorityRule.EXHAUSTED, f"namespace exhausted{origin}"
        if no_class or default:
            return PriorityRule.IN_BUDGET, f"no class chosen{origin}"
        if policy["user_classes"] == "replace":
            return PriorityRule.USER_CLASS_REPLACED, f"class {arrived} replaced (user classes: replace)"
        ceiling = policy["ceiling"]
        if ceiling is None:
            ceiling = self.in_budget_class().value
        info = self.catalog.get(arrived or "")
        if info is not None and info.value <= ceiling:
            return (
                PriorityRule.USER_CLASS_KEPT,
                f"class {arrived} ({info.value}) at or below the ceiling {ceiling}",
            )
        value = "unknown value" if info is None else str(info.value)
        return (
            PriorityRule.USER_CLASS_ABOVE_CEILING,
            f"class {arrived} ({value}) above the ceiling {ceiling}, replaced",
        )

    def _models(
        self, spec: dict[str, Any], admission: NamespaceAdmission, placement: Placement
    ) -> tuple[tuple[str, ...], bool]:
        """The exhausted models (label spellings) the pod can land on, and whether it can be steered off
        them: the namespace steers, the scheduler places the pod, some model it can land on is not
        exhausted, and each exhausted model has a label spelling a NotIn can list."""
        exhausted = [model_key(model) for model in admission.get("exhausted_models", ())]
        reached = tuple(sorted({model for model in exhausted if placement.open_to(model)}))
        steer = (
            bool(reached)
            and admission.get("model_policy") == "steer"
            and all(is_label_value(model) for model in reached)
            and placement.beyond(exhausted)
            and can_steer(spec)
        )
        return reached, steer

    def workload_class(self, kept: WorkloadClass) -> _Class:
        """The class a workload's pods run at: the object's numbers once listed, else its pods' own."""
        if kept.class_name in self.ours:
            return (
                self.in_budget_class()
                if kept.class_name == self.in_budget_class().name
                else self.reduced_class()
            )
        info = self.catalog.get(kept.class_name)
        if info is not None:
            return _Class(kept.class_name, info.value, info.preemption_policy)
        return _Class(
            kept.class_name, kept.priority or 0, kept.preemption_policy or DEFAULT_PREEMPTION_POLICY
        )

    def decide(
        self,
        spec: dict[str, Any],
        view: NamespaceView,
        previous: str | None = None,
        *,
        namespace: str,
        workload: str | None = None,
        kept: WorkloadClass | None = None,
        refused: str | None = None,
        placement: Placement | None = None,
    ) -> PriorityDecision:
        """Decide for one pod of `namespace`. `previous` is the decision annotation it arrived with: a
        re-invoked pod carrying the class that decision set keeps its words, so a second pass patches
        nothing. `kept` is the class `workload`'s pods already run at, None for its first pod and for one
        past the bounds of reuse (`refused` names the bound). `placement`, the models the pod can land on,
        brings in the namespace's exhausted model budgets (None: they are not considered)."""
        arrived = spec.get("priorityClassName") or None
        if view.admission is None:
            state: BudgetState | None = None
            policy = default_priority_policy()
            exhausted = self.settings.missing_state_policy == "over_budget"
            context = f"; state never loaded, missing-state policy {self.settings.missing_state_policy}"
        else:
            state = view.admission["state"]
            policy = view.admission["priority_policy"]
            exhausted = is_over_budget(state)
            context = f"; stale state, last known {state}" if view.freshness == "stale" else ""
        rule, words = self._rule(arrived, namespace, exhausted, policy)
        steer_off: tuple[str, ...] = ()
        spent = ""  # the exhausted models the pod can land on, where it is not steered off them
        if (
            view.admission is not None
            and placement is not None
            and rule != PriorityRule.EXEMPT
            and not exhausted
        ):
            reached, steer = self._models(spec, view.admission, placement)
            if reached and steer:
                steer_off = reached
                if _OUTCOME[rule] == "in_budget":
                    rule, words = (
                        PriorityRule.STEERED,
                        f"steered off exhausted model {', '.join(reached)}; {words}",
                    )
                else:  # a user's own class, at most the ceiling, kept: steered all the same
                    words += f"; steered off exhausted model {', '.join(reached)}"
            elif reached:
                spent = ", ".join(reached)
                _, origin = self._rule(arrived, namespace, True, policy)
                rule = PriorityRule.MODEL_EXHAUSTED
                words = f"model {', '.join(reached)} exhausted{origin.removeprefix('namespace exhausted')}"
        if kept is not None and spent and kept.models_off & set(spent.split(", ")):
            # Its workload's pod was kept off the model this one can land on (a template changed since):
            # keeping that pod's class would carry it onto the exhausted model.
            source, kept = kept.pod, None
            refused = f"keeps no class onto exhausted model {spent} (pod {source} was kept off it)"
        if kept is None and refused is not None:  # the words name the workload already
            words += f"; workload {workload} {refused}"
        elif kept is not None and rule != PriorityRule.EXEMPT:
            # The whole workload runs at one class: a gang split across classes holds GPUs without progress.
            rule, words = (
                PriorityRule.WORKLOAD_CLASS_KEPT,
                f"workload {workload} keeps class {kept.class_name}",
            )
            if spent:  # kept as in an exhausted namespace, and so passed on to no later pod
                words += f"{MODEL_EXHAUSTED_MARK}{spent}"
        elif workload and not workload.startswith("Pod/"):  # a bare pod is its own workload
            words += f"; workload {workload}"
        outcome = _OUTCOME[rule]
        if kept is not None and outcome == "workload":
            ours: _Class | None = self.workload_class(kept)
        else:
            chosen = {"reduced": self.reduced_class, "in_budget": self.in_budget_class}.get(outcome)
            ours = chosen() if chosen else None
        decision = PriorityDecision(
            rule,
            ours.name if ours else None,
            ours.value if ours else None,
            ours.preemption_policy if ours else None,
            state,
            view.freshness,
            words + context,
            steer_off,
        )
        return _as_before(decision, arrived, previous)


def _as_before(decision: PriorityDecision, arrived: str | None, previous: str | None) -> PriorityDecision:
    """The previous decision's rule and words when the pod already has the class they set."""
    if previous is None or arrived is None or arrived != decision.class_name:
        return decision
    rule_id, _, reason = previous.partition(": ")
    try:
        rule = PriorityRule(rule_id)
    except ValueError:
        return decision
    if _OUTCOME[rule] != _OUTCOME[decision.rule]:
        return decision
    return dataclasses.replace(decision, rule=rule, reason=reason)


class DecisionRecorder:
    """Counts decisions by rule and the stale / missing ones, and logs each outage once (again after
    the state has been fresh in between). The admission endpoint calls it, never for a dryRun review."""

    def __init__(self, metrics: WebhookMetrics) -> None:
        self.metrics = metrics
        self._logged: set[Freshness] = set()
        start_at_zero(metrics.priority_decisions, rule=[rule.value for rule in PriorityRule])

    def record(self, decision: PriorityDecision) -> None:
        self.metrics.priority_decisions.labels(rule=decision.rule.value).inc()
        if decision.freshness == "fresh":
            self._logged.clear()
            return
        if decision.freshness == "stale":
            self.metrics.stale_decisions.inc()
        else:
            self.metrics.missing_decisions.inc()
        if decision.freshness not in self._logged:
            self._logged.add(decision.freshness)
            event = "admission_state_stale" if decision.freshness == "stale" else "admission_state_missing"
            log.warning(event, extra={"last_known_state": decision.budget_state, "rule": decision.rule.value})
