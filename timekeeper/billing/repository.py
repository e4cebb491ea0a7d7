"""SQL for weights, prices and the charge basis: Core statements on the billing models."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.billing.models import CLUSTER_SCOPE, ChargeBasis, GpuPrice, GpuWeight
from timekeeper.domain.weights import WeightTimeline, timelines


class BillingRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def weight_changes(self) -> Sequence[GpuWeight]:
        return (
            await self.session.scalars(
                sa.select(GpuWeight).order_by(GpuWeight.model, GpuWeight.effective_from)
            )
        ).all()

    async def timelines(self, models: Sequence[str]) -> dict[str, WeightTimeline]:
        """The weight timelines of these models (absent: never weighted)."""
        if not models:
            return {}
        result = await self.session.execute(
            sa.select(GpuWeight.model, GpuWeight.effective_from, GpuWeight.weight).where(
                GpuWeight.model.in_(models)
            )
        )
        return timelines(result.tuples())

    async def set_weight(self, model: str, weight: Decimal, effective_from: datetime, actor: str) -> None:
        statement = insert(GpuWeight).values(
            model=model, effective_from=effective_from, weight=weight, set_by=actor
        )
        await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[GpuWeight.model, GpuWeight.effective_from],
                set_={"weight": statement.excluded.weight, "set_by": statement.excluded.set_by},
            )
        )

    async def prices(self) -> Sequence[GpuPrice]:
        return (await self.session.scalars(sa.select(GpuPrice).order_by(GpuPrice.model))).all()

    async def price(self, model: str) -> GpuPrice | None:
        return await self.session.get(GpuPrice, model, populate_existing=True)

    async def set_price(self, model: str, price: Decimal, actor: str, now: datetime) -> None:
        statement = insert(GpuPrice).values(
            model=model, price_per_gpu_hour=price, updated_at=now, updated_by=actor
        )
        await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[GpuPrice.model],
                set_={
                    "price_per_gpu_hour": statement.excluded.price_per_gpu_hour,
                    "updated_at": statement.excluded.updated_at,
                    "updated_by": statement.excluded.updated_by,
                },
            )
        )

    async def delete_price(self, model: str) -> bool:
        result = await self.session.execute(sa.delete(GpuPrice).where(GpuPrice.model == model))
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def bases(self, namespaces: Sequence[str]) -> dict[str, tuple[str, Decimal]]:
        """The charge basis rows of these namespaces and of the cluster (CLUSTER_SCOPE), where set."""
        result = await self.session.execute(
            sa.select(ChargeBasis.scope, ChargeBasis.basis, ChargeBasis.floor).where(
                ChargeBasis.scope.in_([CLUSTER_SCOPE, *namespaces])
            )
        )
        return {scope: (basis, floor) for scope, basis, floor in result.tuples()}

    async def set_basis(self, scope: str, basis: str, floor: Decimal, actor: str, now: datetime) -> None:
        statement = insert(ChargeBasis).values(
            scope=scope, basis=basis, floor=floor, updated_at=now, updated_by=actor
        )
        await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[ChargeBasis.scope],
                set_={
                    "basis": statement.excluded.basis,
                    "floor": statement.excluded.floor,
                    "updated_at": statement.excluded.updated_at,
                    "updated_by": statement.excluded.updated_by,
                },
            )
        )

    async def delete_basis(self, scope: str) -> bool:
        result = await self.session.execute(sa.delete(ChargeBasis).where(ChargeBasis.scope == scope))
        return bool(result.rowcount)  # type: ignore[attr-defined]
