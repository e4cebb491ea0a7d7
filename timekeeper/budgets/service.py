"""Budget status, budget changes, defaults and grants. Every change is audited, refreshes the states of
the namespaces it affects and gives the admission snapshot a new version, in the request's transaction."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.admission_state import default_priority_policy, is_over_budget
from gpuaccounting.wire import BudgetState
from timekeeper.audit.repository import AuditRepository
from timekeeper.auth.base import Principal
from timekeeper.budgets.forecast import forecast
from timekeeper.budgets.guard import refuse_if_managed
from timekeeper.budgets.model_figures import forecast_window, models_out
from timekeeper.budgets.models import Grant
from timekeeper.budgets.repository import BudgetRepository, statuses
from timekeeper.budgets.schemas import (
    BudgetConfigOut,
    BudgetIn,
    ForecastOut,
    GrantEntryOut,
    GrantIn,
    GrantOut,
    GrantStatus,
    ModelBudgetConfigOut,
    NamespaceBudgetOut,
    PriorityPolicyBody,
    model_amounts,
)
from timekeeper.budgets.states.budget_states import BudgetStates, unpooled_states
from timekeeper.clock import Clock
from timekeeper.domain.clusters import split_key
from timekeeper.domain.figures import (
    SHIPPED_RUNNING_POD_ACTION,
    UNKNOWN_MODEL,
    BudgetConfig,
    NamespaceFigures,
)
from timekeeper.domain.periods import PeriodKind, period_containing
from timekeeper.domain.states import model_states as domain_model_states
from timekeeper.errors import TimekeeperError
from timekeeper.schemas import period_out
from timekeeper.settings import Settings


def config_out(config: BudgetConfig) -> BudgetConfigOut:
    return BudgetConfigOut(
        budget_gpu_minutes=config.budget_gpu_minutes,
        period=config.period,
        warn_at_fraction=config.warn_at_fraction,
        max_gpu_share_per_pod=config.max_gpu_share_per_pod,
        concurrent_gpu_limit=config.concurrent_gpu_limit,
        priority_policy=PriorityPolicyBody.model_validate(config.priority_policy),
        running_pod_action=config.running_pod_action,
        models={
            model: ModelBudgetConfigOut(budget_gpu_minutes=amount) for model, amount in config.models.items()
        },
        model_policy=config.model_policy,
    )


def stored_values(body: BudgetIn, current: BudgetConfig | None) -> dict[str, Any]:
    """What a PUT stores: the v1 fields as given (a full replacement); each enforcement field as given
    (None: follow the default), or as it is now when the body leaves it out (BudgetIn's docstring)."""
    values = body.model_dump(exclude={"priority_policy", "running_pod_action", "models"})
    values["models"] = model_amounts(body.models)
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


def status_out(
    figures: NamespaceFigures,
    now: datetime,
    burned: Decimal,
    state: BudgetState,
    settings: Settings,
    model_states: Mapping[str, BudgetState] | None = None,
    model_burned: Mapping[str, Decimal] | None = None,
    model_used: Mapping[str, Decimal] | None = None,
) -> NamespaceBudgetOut:
    """`burned`: the GPU-minutes the namespace was charged over the forecast window up to now;
    `state`: the one its figures put it in (its pool's rule for a pool member); `model_states`,
    `model_burned` and `model_used` the same per GPU model (None: its own figures' states and use; no
    burn). A pool member's model figures are its pool's: every member's use of the model together."""
    config = figures.config
    budget = config.budget_gpu_minutes
    remaining = None if budget is None else budget + figures.granted_gpu_minutes - figures.used_gpu_minutes
    over = is_over_budget(state)
    period = period_out(config.period, now)
    outlook = forecast(now, forecast_window(settings), burned, remaining, period.end)
    cluster, namespace = split_key(figures.namespace)
    return NamespaceBudgetOut(
        namespace=namespace,
        cluster=cluster,
        source="namespace" if config.explicit else "default",
        period=period,
        budget_gpu_minutes=budget,
        granted_gpu_minutes=figures.granted_gpu_minutes,
        used_gpu_minutes=figures.used_gpu_minutes,
        remaining_gpu_minutes=remaining,
        state=state,
        priority_class=settings.over_budget_priority_class if over else settings.in_budget_priority_class,
        warn_at_fraction=config.warn_at_fraction,
        max_gpu_share_per_pod=config.max_gpu_share_per_pod,
        concurrent_gpu_limit=config.concurrent_gpu_limit,
        priority_policy=PriorityPolicyBody.model_validate(config.priority_policy),
        priority_policy_source="namespace" if config.own_priority_policy else "default",
        running_pod_action=config.running_pod_action,
        running_pod_action_source="namespace" if config.own_running_pod_action else "default",
        pool=config.pool,
        forecast=ForecastOut(
            window_minutes=outlook.window_minutes,
            burn_rate_gpu_minutes_per_hour=outlook.burn_rate_gpu_minutes_per_hour,
            exhausts_at=outlook.exhausts_at,
        ),
        models=models_out(
            config.models,
            figures.model_used if model_used is None else model_used,
            now,
            domain_model_states(figures) if model_states is None else model_states,
            model_burned or {},
            settings,
            period.end,
        ),
        model_policy=config.model_policy,
        unknown_model_used_gpu_minutes=figures.model_used.get(UNKNOWN_MODEL, Decimal(0)),
    )


class BudgetReads:
    """Budget statuses, on a session: a write's own, or an autocommit read session (GET
    /namespaces/{ns}/budget, GET /namespaces)."""

    def __init__(self, session: AsyncSession, settings: Settings, clock: Clock) -> None:
        self.session = session
        self.settings = settings
        self.clock = clock

    async def _statuses(self, namespaces: list[str] | None) -> list[NamespaceBudgetOut]:
        """The figures and each namespace's charge over the forecast window (its burn buckets), read in
        one statement."""
        now = self.clock.now()
        found, burned, model_burned = await statuses(
            self.session, now, now - forecast_window(self.settings), namespaces
        )
        states = unpooled_states(found)
        model_states = None
        model_used: dict[str, dict[str, Decimal]] = {}
        if states is None:
            deciding = BudgetStates(self.session)
            states = await deciding.decide(found, now)
            model_states, model_used = await deciding.model_figures(found, now)
        return [
            status_out(
                figures,
                now,
                burned.get(figures.namespace, Decimal(0)),
                states[figures.namespace],
                self.settings,
                None if model_states is None else model_states[figures.namespace],
                model_burned.get(figures.namespace),
                model_used.get(figures.namespace),
            )
            for figures in found
        ]

    async def status(self, namespace: str) -> NamespaceBudgetOut:
        """Any namespace has a status: one the timekeeper has not heard of yet is on the default, unused."""
        [status] = await self._statuses([namespace])
        return status

    async def all(self) -> list[NamespaceBudgetOut]:
        return await self._statuses(None)

    async def some(self, namespaces: list[str]) -> list[NamespaceBudgetOut]:
        """Exactly these namespaces (known or not, as `status`)."""
        return await self._statuses(namespaces)


class BudgetService:
    def __init__(self, session: AsyncSession, settings: Settings, clock: Clock) -> None:
        self.session = session
        self.repository = BudgetRepository(session)
        self.audit = AuditRepository(session)
        self.states = BudgetStates(session)
        self.reads = BudgetReads(session, settings, clock)
        self.settings = settings
        self.clock = clock

    async def status(self, namespace: str) -> NamespaceBudgetOut:
        return await self.reads.status(namespace)

    async def refuse_if_managed(self, namespace: str | None) -> None:
        """409 when a Kubernetes object governs the budget (None: the default) a REST call would change."""
        await refuse_if_managed(self.session, namespace)

    async def all(self) -> list[NamespaceBudgetOut]:
        return await self.reads.all()

    async def some(self, namespaces: list[str]) -> list[NamespaceBudgetOut]:
        return await self.reads.some(namespaces)

    async def _refresh_after_change(
        self, namespaces: list[str] | None, kind_before: PeriodKind, kind_after: PeriodKind
    ) -> None:
        """After a change: a new period kind gets its current totals rebuilt from the ledger (the running
        total for that kind missed charges made under the old one); then refresh the states and bump the
        version."""
        now = self.clock.now()
        if kind_before != kind_after:
            targets = (
                await self.repository.namespaces_following_default() if namespaces is None else namespaces
            )
            period = period_containing(kind_after, now)
            await self.repository.rebuild_totals(targets, kind_after, period.start, period.end)
        await self.states.refresh(now, namespaces, config_changed=True)

    async def put(self, namespace: str, body: BudgetIn, principal: Principal) -> NamespaceBudgetOut:
        previous = await self.repository.own(namespace)
        before = await self.repository.effective(namespace)
        await self.repository.put_own(
            namespace, stored_values(body, previous), principal.name, self.clock.now()
        )
        after = await self.repository.effective(namespace)
        await self.audit.record(
            self.clock.now(),
            principal,
            "budget.put",
            namespace,
            None if previous is None else previous.as_json(),
            after.as_json(),
        )
        await self._refresh_after_change([namespace], before.period, after.period)
        return await self.status(namespace)

    async def delete(self, namespace: str, principal: Principal) -> NamespaceBudgetOut:
        """The namespace returns to the default."""
        previous = await self.repository.own(namespace)
        if previous is None:
            raise TimekeeperError(f"namespace {namespace} has no budget of its own", 404)
        await self.repository.delete_own(namespace)
        after = await self.repository.effective(namespace)
        await self.audit.record(
            self.clock.now(), principal, "budget.delete", namespace, previous.as_json(), None
        )
        await self._refresh_after_change([namespace], previous.period, after.period)
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
            self.clock.now(), principal, "defaults.put", None, previous.as_json(), after.as_json()
        )
        await self._refresh_after_change(None, previous.period, after.period)
        return config_out(after)

    async def grant(self, namespace: str, body: GrantIn, principal: Principal) -> GrantOut:
        """A one-off top-up for the namespace's current period, until `expires_at` when given."""
        now = self.clock.now()
        config = await self.repository.effective(namespace)
        period = period_containing(config.period, now)
        expires_at = body.expires_at
        if expires_at is not None and (
            expires_at <= now or (period.end is not None and expires_at > period.end)
        ):
            raise TimekeeperError(
                "expires_at must be after now and no later than the end of the current period"
                + ("" if period.end is None else f" ({period.end.isoformat()})"),
                422,
            )
        grant = await self.repository.insert_grant(
            namespace, body.gpu_minutes, body.reason, principal.name, now, expires_at
        )
        await self.repository.add_granted(namespace, config.period, period.start, body.gpu_minutes)
        await self.audit.record(
            now,
            principal,
            "grant.create",
            namespace,
            None,
            {
                "id": grant.id,
                "gpu_minutes": format(body.gpu_minutes.normalize(), "f"),
                "reason": body.reason,
                "period_start": period.start.isoformat(),
                "expires_at": None if expires_at is None else expires_at.isoformat(),
            },
        )
        await self.states.refresh(now, [namespace], config_changed=True)
        return await self._grant_out(grant, config.period, now)

    async def grants(self, namespace: str, limit: int, before_id: int | None) -> list[GrantEntryOut]:
        """The namespace's grants, newest first, each with whether it counts now."""
        now = self.clock.now()
        current = period_containing((await self.repository.effective(namespace)).period, now)
        return [
            grant_entry(grant, current.start, now)
            for grant in await self.repository.grants(namespace, limit, before_id)
        ]

    async def revoke(self, namespace: str, grant_id: int, principal: Principal) -> GrantOut:
        """The grant stops counting from now: the period's granted total is recomputed and the state refreshed
        in this transaction. Revoking a revoked grant changes nothing (no second audit entry); another
        namespace's grant is 404."""
        now = self.clock.now()
        grant = await self.repository.grant_for_update(namespace, grant_id)
        if grant is None:
            raise TimekeeperError(f"namespace {namespace} has no grant {grant_id}", 404)
        config = await self.repository.effective(namespace)
        if grant.revoked_at is not None:
            return await self._grant_out(grant, config.period, now)
        previous = grant_entry(grant, period_containing(config.period, now).start, now).status
        grant = await self.repository.revoke_grant(grant_id, principal.name, now)
        await self.audit.record(
            now,
            principal,
            "grant.revoke",
            namespace,
            {"id": grant_id, "status": previous},
            {"id": grant_id, "status": "revoked", "gpu_minutes": format(grant.gpu_minutes.normalize(), "f")},
        )
        await refresh_granted(self.repository, namespace, config.period, now)
        await self.states.refresh(now, [namespace], config_changed=True)
        return await self._grant_out(grant, config.period, now)

    async def _grant_out(self, grant: Grant, kind: PeriodKind, now: datetime) -> GrantOut:
        current = period_containing(kind, now)
        return GrantOut(
            **grant_entry(grant, current.start, now).model_dump(),
            period=period_out(kind, grant.granted_at),
            budget=await self.status(grant.namespace),
        )


async def refresh_granted(
    repository: BudgetRepository, namespace: str, kind: PeriodKind, now: datetime
) -> None:
    """The namespace's current granted total, recomputed from the grants that still count."""
    period = period_containing(kind, now)
    await repository.refresh_granted(namespace, kind, period.start, period.end)


async def end_expired_grants(repository: BudgetRepository, now: datetime) -> list[str]:
    """The periodic sweep: grants whose expiry passed stop counting and their namespaces' granted
    totals are recomputed (the caller refreshes their states). Answers those namespaces."""
    namespaces = await repository.end_expired_grants(now)
    for namespace in namespaces:
        await refresh_granted(repository, namespace, (await repository.effective(namespace)).period, now)
    return namespaces


def grant_entry(grant: Grant, current_start: datetime, now: datetime) -> GrantEntryOut:
    """A grant as listed, with its status now (the period it counts for: the one it was granted in)."""
    status: GrantStatus
    if grant.revoked_at is not None:
        status = "revoked"
    elif grant.ended_at is not None or (grant.expires_at is not None and grant.expires_at <= now):
        status = "expired"
    elif grant.granted_at < current_start:
        status = "lapsed"
    else:
        status = "active"
    cluster, namespace = split_key(grant.namespace)
    return GrantEntryOut(
        id=grant.id,
        namespace=namespace,
        cluster=cluster,
        gpu_minutes=grant.gpu_minutes,
        reason=grant.reason,
        granted_by=grant.granted_by,
        granted_at=grant.granted_at,
        expires_at=grant.expires_at,
        revoked_at=grant.revoked_at,
        revoked_by=grant.revoked_by,
        ended_at=grant.ended_at,
        status=status,
    )
