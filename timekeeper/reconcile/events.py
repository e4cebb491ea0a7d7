"""The Events the reconciler posts: a namespace's budget state changes, and each downgraded pod. An
Event that cannot be posted is logged, never fatal to the pass."""

from __future__ import annotations

import logging

from gpuaccounting.wire import BudgetState
from timekeeper.kube import KubeClient, KubeError, ObjectReference, PodInfo
from timekeeper.reconcile.decisions import state_changes
from timekeeper.reconcile.result import PassResult
from timekeeper.settings import Settings

log = logging.getLogger(__name__)

_TRANSITION_EVENTS: dict[BudgetState, tuple[str, str]] = {
    "exhausted": ("GPUBudgetExhausted", "Warning"),
    "warning": ("GPUBudgetWarning", "Warning"),
    "in_budget": ("GPUBudgetRestored", "Normal"),
    "unlimited": ("GPUBudgetRestored", "Normal"),
}


class Announcer:
    """Posts the Events; remembers the states the last pass saw (None: learnt by the next pass)."""

    def __init__(self, kube: KubeClient, settings: Settings) -> None:
        self.kube = kube
        self.settings = settings
        self._last_states: dict[str, BudgetState] | None = None

    def forget(self) -> None:
        self._last_states = None

    async def announce_states(self, states: dict[str, BudgetState], result: PassResult) -> None:
        """An Event on the namespace for each state change since the last pass (the first pass of a
        replica only learns the states, so a restart does not repeat old news)."""
        last, self._last_states = self._last_states, dict(states)
        if last is None:
            return
        for namespace, before, state in state_changes(last, states):
            result.transitions[namespace] = (before, state)
            reason, type_ = _TRANSITION_EVENTS[state]
            message = f"GPU budget state {before or 'new'} -> {state}"
            if state == "exhausted":
                message += f"; new GPU pods get PriorityClass {self.settings.over_budget_priority_class}"
            await self.post(namespace, reason, message, type_)

    async def announce_downgrade(self, info: PodInfo, how: str) -> None:
        message = (
            f"{how}: namespace {info.namespace} has spent its GPU budget; its controller recreates "
            f"the pod at PriorityClass {self.settings.over_budget_priority_class}"
        )
        pod_ref = ObjectReference("Pod", info.name, info.namespace, uid=info.uid)
        await self.post(info.namespace, "GPUBudgetDowngrade", message, "Warning", pod_ref)
        await self.post(info.namespace, "GPUBudgetDowngrade", f"pod {info.name} {message}", "Normal")

    async def post(
        self,
        namespace: str,
        reason: str,
        message: str,
        type_: str,
        involved: ObjectReference | None = None,
    ) -> None:
        try:
            await self.kube.post_event(namespace, reason, message, type_, involved)
        except KubeError as error:
            log.warning("event_failed", extra={"namespace": namespace, "reason": reason, "error": str(error)})
