"""Billing weights (with their history: a change applies from its time on), prices per GPU-hour, and the
charge basis (allocation, or allocation x measured utilisation) per namespace and cluster-wide."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import CheckConstraint, DateTime, Numeric, Text, func
from sqlalchemy.orm import Mapped, mapped_column

from timekeeper.db.base import Base
from timekeeper.domain.weights import CLUSTER_SCOPE

__all__ = ["CLUSTER_SCOPE", "ChargeBasis", "GpuPrice", "GpuWeight"]

WEIGHT = Numeric(12, 6)


class GpuWeight(Base):
    """One change of a model's weight; it holds from `effective_from` until the model's next change."""

    __tablename__ = "gpu_weights"
    __table_args__ = (CheckConstraint("weight > 0", name="positive"),)

    model: Mapped[str] = mapped_column(Text, primary_key=True)
    effective_from: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    weight: Mapped[Decimal] = mapped_column(WEIGHT)
    set_by: Mapped[str] = mapped_column(Text)


class GpuPrice(Base):
    """What an hour of one whole GPU of a model costs, for the chargeback export."""

    __tablename__ = "gpu_prices"
    __table_args__ = (CheckConstraint("price_per_gpu_hour >= 0", name="not_negative"),)

    model: Mapped[str] = mapped_column(Text, primary_key=True)
    price_per_gpu_hour: Mapped[Decimal] = mapped_column(Numeric(18, 6))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_by: Mapped[str] = mapped_column(Text)


class ChargeBasis(Base):
    """How a namespace's pods are charged: `allocation` (share x time) or `measured` (share x time x
    max(floor, mean SM utilisation)). Scope `*` is the cluster default."""

    __tablename__ = "charge_basis"
    __table_args__ = (
        CheckConstraint("basis IN ('allocation', 'measured')", name="basis_kind"),
        CheckConstraint("floor >= 0 AND floor <= 1", name="floor_fraction"),
    )

    scope: Mapped[str] = mapped_column(Text, primary_key=True)
    basis: Mapped[str] = mapped_column(Text)
    floor: Mapped[Decimal] = mapped_column(Numeric(3, 2))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_by: Mapped[str] = mapped_column(Text)
