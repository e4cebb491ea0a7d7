"""Admin changes to weights, prices and the charge basis (each audited), and what readers see of them."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.audit.repository import AuditRepository
from timekeeper.auth.base import Principal
from timekeeper.billing.models import CLUSTER_SCOPE
from timekeeper.billing.repository import BillingRepository
from timekeeper.billing.schemas import (
    ChargeBasisIn,
    ChargeBasisOut,
    PriceIn,
    PriceOut,
    WeightIn,
    WeightOut,
    WeightsOut,
)
from timekeeper.clock import Clock
from timekeeper.domain.weights import ONE, model_key, resolve_basis
from timekeeper.errors import TimekeeperError
from timekeeper.settings import Settings


class BillingService:
    def __init__(self, session: AsyncSession, settings: Settings, clock: Clock) -> None:
        self.repository = BillingRepository(session)
        self.audit = AuditRepository(session)
        self.settings = settings
        self.clock = clock

    async def weights(self) -> WeightsOut:
        now = self.clock.now()
        current: dict[str, WeightOut] = {}
        scheduled: list[WeightOut] = []
        for change in await self.repository.weight_changes():
            out = WeightOut(
                model=change.model,
                weight=change.weight,
                effective_from=change.effective_from,
                set_by=change.set_by,
            )
            if change.effective_from <= now:
                current[change.model] = out
            else:
                scheduled.append(out)
        return WeightsOut(weights=[out for out in current.values() if out.weight != ONE], scheduled=scheduled)

    def _from(self, requested: datetime | None) -> datetime:
        """When a change takes effect: never before a report already charged could end (its interval may
        end up to the clock-skew allowance ahead of now)."""
        earliest = self.clock.now() + self.settings.clock_skew
        if requested is None:
            return earliest
        if requested < earliest:
            raise TimekeeperError(
                "effective_from must not be before now plus the clock-skew allowance "
                f"({self.settings.clock_skew.total_seconds():g} s): "
                "time already charged is never re-weighted",
                422,
            )
        return requested

    async def set_weight(self, model: str, body: WeightIn, principal: Principal) -> WeightOut:
        key = model_key(model)
        effective_from = self._from(body.effective_from)
        await self.repository.set_weight(key, body.weight, effective_from, principal.name)
        await self.audit.record(
            self.clock.now(),
            principal,
            "weight.put",
            None,
            None,
            {"model": key, "weight": str(body.weight), "effective_from": effective_from.isoformat()},
        )
        return WeightOut(model=key, weight=body.weight, effective_from=effective_from, set_by=principal.name)

    async def reset_weight(self, model: str, principal: Principal) -> WeightOut:
        """The model counts 1 again, from now on (its history stays: past charges keep their weight)."""
        key = model_key(model)
        if not await self.repository.timelines([key]):
            raise TimekeeperError(f"GPU model {key} has never been weighted", 404)
        effective_from = self._from(None)
        await self.repository.set_weight(key, ONE, effective_from, principal.name)
        await self.audit.record(
            self.clock.now(),
            principal,
            "weight.reset",
            None,
            None,
            {"model": key, "weight": "1", "effective_from": effective_from.isoformat()},
        )
        return WeightOut(model=key, weight=ONE, effective_from=effective_from, set_by=principal.name)

    def _price_out(self, model: str, price: object, updated_at: datetime, updated_by: str) -> PriceOut:
        return PriceOut(
            model=model,
            price_per_gpu_hour=price,  # type: ignore[arg-type]
            currency=self.settings.billing_currency,
            updated_at=updated_at,
            updated_by=updated_by,
        )

    async def prices(self) -> list[PriceOut]:
        return [
            self._price_out(p.model, p.price_per_gpu_hour, p.updated_at, p.updated_by)
            for p in await self.repository.prices()
        ]

    async def set_price(self, model: str, body: PriceIn, principal: Principal) -> PriceOut:
        key = model_key(model)
        now = self.clock.now()
        previous = await self.repository.price(key)
        await self.repository.set_price(key, body.price_per_gpu_hour, principal.name, now)
        await self.audit.record(
            now,
            principal,
            "price.put",
            None,
            None
            if previous is None
            else {"model": key, "price_per_gpu_hour": str(previous.price_per_gpu_hour)},
            {"model": key, "price_per_gpu_hour": str(body.price_per_gpu_hour)},
        )
        return self._price_out(key, body.price_per_gpu_hour, now, principal.name)

    async def delete_price(self, model: str, principal: Principal) -> None:
        key = model_key(model)
        previous = await self.repository.price(key)
        if previous is None or not await self.repository.delete_price(key):
            raise TimekeeperError(f"GPU model {key} has no price", 404)
        await self.audit.record(
            self.clock.now(),
            principal,
            "price.delete",
            None,
            {"model": key, "price_per_gpu_hour": str(previous.price_per_gpu_hour)},
            None,
        )

    async def basis(self, namespace: str | None) -> ChargeBasisOut:
        rows = await self.repository.bases([] if namespace is None else [namespace])
        basis, source = resolve_basis(CLUSTER_SCOPE if namespace is None else namespace, rows)
        return ChargeBasisOut(basis=basis.kind, floor=basis.floor, source=source)  # type: ignore[arg-type]

    async def set_basis(
        self, namespace: str | None, body: ChargeBasisIn, principal: Principal
    ) -> ChargeBasisOut:
        """From now on: reports already charged keep the basis they were charged under."""
        now = self.clock.now()
        before = await self.basis(namespace)
        await self.repository.set_basis(
            CLUSTER_SCOPE if namespace is None else namespace, body.basis, body.floor, principal.name, now
        )
        await self.audit.record(
            now,
            principal,
            "charge_basis.put",
            namespace,
            before.model_dump(mode="json"),
            {"basis": body.basis, "floor": str(body.floor)},
        )
        return await self.basis(namespace)

    async def delete_basis(self, namespace: str | None, principal: Principal) -> ChargeBasisOut:
        before = await self.basis(namespace)
        if not await self.repository.delete_basis(CLUSTER_SCOPE if namespace is None else namespace):
            raise TimekeeperError("no charge basis of its own is set here", 404)
        await self.audit.record(
            self.clock.now(),
            principal,
            "charge_basis.delete",
            namespace,
            before.model_dump(mode="json"),
            None,
        )
        return await self.basis(namespace)
