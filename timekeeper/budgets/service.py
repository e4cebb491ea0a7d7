"""Budget status, budget changes, defaults and grants. Every change is audited, re-states the namespaces
it affects and gives the admission snapshot a new version, all in the request's transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.admission_state import default_priority_policy, is_over_budget
from timekeeper.admission.service import AdmissionService, figures_state
from timekeeper.audit.repository import AuditRepository
from timekeeper.auth.base import Principal
from timekeeper.budgets.models import SHIPPED_RUNNING_POD_ACTION
from timekeeper.budgets.periods import EPOCH, PeriodKind, period_containing
from timekeeper.budgets.repository import BudgetConfig, BudgetRepository, NamespaceFigures
from timekeeper.budgets.schemas import (
    BudgetConfigOut,
    BudgetIn,
    GrantIn,
    GrantOut,
    NamespaceBudgetOut,
    PeriodOut,
    PriorityPolicyBody,
)
from timekeeper.clock import Clock
from timekeeper.errors import TimekeeperError
from timekeeper.settings import Settings


def period_out(kind: PeriodKind, moment: datetime) -> PeriodOut:
    period = period_containing(kind, moment)
    return PeriodOut(kind=kind, start=None if period.start == EPOCH else period.start, end=period.end)


def config_out(config: BudgetConfig) -> BudgetConfigOut:
    return BudgetConfigOut(
        budget_gpu_minutes=config.budget_gpu_minutes,
        period=config.period,
        warn_at_fraction=config.warn_at_fraction,
        max_gpu_share_per_pod=config.max_gpu_share_per_pod,
        concurrent_gpu_limit=config.concurrent_gpu_limit,
        priority_policy=PriorityPolicyBody.model_validate(config.priority_policy),
        running_pod_action=config.running_pod_action,
    )


def stored_values(body: BudgetIn, current: BudgetConfig | None) -> dict[str, Any]:
    """What a PUT stores: the v1 fields as given (a full replacement); each enforcement field as given
    (None: follow the default), or as it is now when the body leaves it out (BudgetIn's docstring)."""
    values = body.model_dump(exclude={"priority_policy", "running_pod_action"})
    given = body.model_fields_set
    if "priority_policy" in given:
        values["priority_policy"] = None if body.priority_policy is None else body.priority_policy.as_policy()
    else:
        values["priority_policy"] = None if current is None else current.stored_priority_policy
    if "running_pod_action" in given:
        values["running_pod_action"] = body.running_pod_action
    else:
        values["running_pod_action"] = None if current is None else current.stored_running_pod_action
    return values


class BudgetService:
    def __init__(self, session: AsyncSession, settings: Settings, clock: Clock) -> None:
        self.repository = BudgetRepository(session)
        self.audit = AuditRepository(session)
        self.admission = AdmissionService(session, settings)
        self.settings = settings
        self.clock = clock

    def _out(self, figures: NamespaceFigures, now: datetime) -> NamespaceBudgetOut:
        config = figures.config
        state = figures_state(figures)
        budget = config.budget_gpu_minutes
        remaining = (
            None if budget is None else budget + figures.granted_gpu_minutes - figures.used_gpu_minutes
        )
        over = is_over_budget(state)
        return NamespaceBudgetOut(
            namespace=figures.namespace,
            source="namespace" if config.explicit else "default",
            period=period_out(config.period, now),
            budget_gpu_minutes=budget,
            granted_gpu_minutes=figures.granted_gpu_minutes,
            used_gpu_minutes=figures.used_gpu_minutes,
            remaining_gpu_minutes=remaining,
            state=state,
            priority_class=self.settings.over_budget_priority_class
            if over
            else self.settings.in_budget_priority_class,
            warn_at_fraction=config.warn_at_fraction,
            max_gpu_share_per_pod=config.max_gpu_share_per_pod,
            concurrent_gpu_limit=config.concurrent_gpu_limit,
            priority_policy=PriorityPolicyBody.model_validate(config.priority_policy),
            priority_policy_source="namespace" if config.own_priority_policy else "default",
            running_pod_action=config.running_pod_action,
            running_pod_action_source="namespace" if config.own_running_pod_action else "default",
        )

    async def status(self, namespace: str) -> NamespaceBudgetOut:
        """Any namespace has a status: one the timekeeper has not heard of yet is on the default, unused."""
        now = self.clock.now()
        [figures] = await self.repository.figures(now, [namespace])
        return self._out(figures, now)

    async def all(self) -> list[NamespaceBudgetOut]:
        now = self.clock.now()
        return [self._out(figures, now) for figures in await self.repository.figures(now)]

    async def some(self, namespaces: list[str]) -> list[NamespaceBudgetOut]:
        """Exactly these namespaces (known or not, as `status`)."""
        now = self.clock.now()
        return [self._out(figures, now) for figures in await self.repository.figures(now, namespaces)]

    async def _settle(
        self, namespaces: list[str] | None, kind_before: PeriodKind, kind_after: PeriodKind
    ) -> None:
        """After a change: a new period kind gets its current totals rebuilt from the ledger (the running
        total for that kind missed charges made under the old one); then re-state and bump the version."""
        now = self.clock.now()
        if kind_before != kind_after:
            targets = (
                await self.repository.namespaces_following_default() if namespaces is None else namespaces
            )
            period = period_containing(kind_after, now)
            await self.repository.rebuild_totals(targets, kind_after, period.start, period.end)
        await self.admission.restate(now, namespaces, config_changed=True)

    async def put(self, namespace: str, body: BudgetIn, principal: Principal) -> NamespaceBudgetOut:
        previous = await self.repository.own(namespace)
        before = await self.repository.effective(namespace)
        await self.repository.put_own(
            namespace, stored_values(body, previous), principal.name, self.clock.now()
        )
        after = await self.repository.effective(namespace)
        await self.audit.record(
            self.clock.now(),
            principal.name,
            "budget.put",
            namespace,
            None if previous is None else previous.as_json(),
            after.as_json(),
        )
        await self._settle([namespace], before.period, after.period)
        return await self.status(namespace)

    async def delete(self, namespace: str, principal: Principal) -> NamespaceBudgetOut:
        """The namespace returns to the default."""
        previous = await self.repository.own(namespace)
        if previous is None:
            raise TimekeeperError(f"namespace {namespace} has no budget of its own", 404)
        await self.repository.delete_own(namespace)
        after = await self.repository.effective(namespace)
        await self.audit.record(
            self.clock.now(), principal.name, "budget.delete", namespace, previous.as_json(), None
        )
        await self._settle([namespace], previous.period, after.period)
        return await self.status(namespace)

    async def default(self) -> BudgetConfigOut:
        return config_out(await self.repository.default())

    async def put_default(self, body: BudgetIn, principal: Principal) -> BudgetConfigOut:
        previous = await self.repository.default()
        values = stored_values(body, previous)
        # The default follows nothing: a null there means the shipped default.
        values["priority_policy"] = values["priority_policy"] or default_priority_policy()
        values["running_pod_action"] = values["running_pod_action"] or SHIPPED_RUNNING_POD_ACTION
        await self.repository.put_default(values, principal.name, self.clock.now())
        after = await self.repository.default()
        await self.audit.record(
            self.clock.now(), principal.name, "defaults.put", None, previous.as_json(), after.as_json()
        )
        await self._settle(None, previous.period, after.period)
        return config_out(after)

    async def grant(self, namespace: str, body: GrantIn, principal: Principal) -> GrantOut:
        """A one-off top-up for the namespace's current period."""
        now = self.clock.now()
        config = await self.repository.effective(namespace)
        period = period_containing(config.period, now)
        grant_id = await self.repository.insert_grant(
            namespace, body.gpu_minutes, body.reason, principal.name, now
        )
        await self.repository.add_granted(namespace, config.period, period.start, body.gpu_minutes)
        await self.audit.record(
            now,
            principal.name,
            "grant.create",
            namespace,
            None,
            {
                "id": grant_id,
                "gpu_minutes": format(body.gpu_minutes.normalize(), "f"),
                "reason": body.reason,
                "period_start": period.start.isoformat(),
            },
        )
        await self.admission.restate(now, [namespace], config_changed=True)
        return GrantOut(
            id=grant_id,
            namespace=namespace,
            gpu_minutes=body.gpu_minutes,
            reason=body.reason,
            granted_by=principal.name,
            granted_at=now,
            period=period_out(config.period, now),
            budget=await self.status(namespace),
        )
