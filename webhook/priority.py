"""Which PriorityClass a GPU pod gets, from its namespace's cached budget state and the stale-state policy."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gpuaccounting.admission_state import is_over_budget
from webhook.metrics import WebhookMetrics
from webhook.settings import WebhookSettings
from webhook.state import NamespaceView

log = logging.getLogger("webhook.priority")


@dataclass(frozen=True, slots=True)
class PriorityDecision:
    class_name: str | None  # None: the pod keeps the class its user chose
    priority: int | None
    preemption_policy: str | None
    budget_state: str
    reason: str

    def apply(self, spec: dict[str, Any]) -> None:
        if self.class_name is None:
            return
        spec["priorityClassName"] = self.class_name
        spec["priority"] = self.priority
        spec["preemptionPolicy"] = self.preemption_policy


class PriorityPolicy:
    def __init__(self, settings: WebhookSettings, metrics: WebhookMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.ours = frozenset({settings.in_budget_priority_class, settings.over_budget_priority_class})
        self._logged: set[str] = set()

    def _choose(self, over_budget: bool, budget_state: str, reason: str) -> PriorityDecision:
        s = self.settings
        if over_budget:
            return PriorityDecision(
                s.over_budget_priority_class,
                s.over_budget_priority,
                s.over_budget_preemption_policy,
                budget_state,
                reason,
            )
        return PriorityDecision(
            s.in_budget_priority_class,
            s.in_budget_priority,
            s.in_budget_preemption_policy,
            budget_state,
            reason,
        )

    def _log_once(self, event: str, **fields: Any) -> None:
        if event not in self._logged:
            self._logged.add(event)
            log.warning(event, extra=fields)

    def decide(self, spec: dict[str, Any], view: NamespaceView, *, dry_run: bool) -> PriorityDecision:
        """Decide for one pod; dryRun requests are decided alike but leave no trace in metrics or logs."""
        chosen = spec.get("priorityClassName")
        state = view.admission["state"] if view.admission is not None else None
        known = state or "unknown"
        over_budget = state is not None and is_over_budget(state)
        if (
            chosen
            and chosen not in self.ours
            and chosen not in self.settings.replaceable_priority_classes
            and not self.settings.override_foreign_priority_class
        ):
            return PriorityDecision(None, None, None, known, f"kept user-chosen class {chosen}")
        if view.freshness == "fresh":
            if self._logged:  # the state is back: the next outage is logged again
                self._logged.clear()
            return self._choose(over_budget, known, f"namespace {known}")
        if view.freshness == "missing":
            if not dry_run:
                self.metrics.missing_decisions.inc()
                self._log_once("admission_state_missing", policy=self.settings.missing_state_policy)
            missing = self.settings.missing_state_policy
            return self._choose(missing == "over_budget", known, f"state never loaded, policy {missing}")
        if not dry_run:
            self.metrics.stale_decisions.inc()
            self._log_once("admission_state_stale", policy=self.settings.stale_state_policy)
        policy = self.settings.stale_state_policy
        age = f"state older than {self.settings.state_max_age_seconds:g}s"
        if policy == "last_known":
            return self._choose(over_budget, known, f"{age}, last known {known}")
        return self._choose(policy == "over_budget", known, f"{age}, policy {policy}")
