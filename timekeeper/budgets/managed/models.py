"""Which budgets a Kubernetes object governs: written by the sync as soon as it sees the object (even one
whose spec is invalid), read by the budget API to refuse a REST change to them."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Text
from sqlalchemy.orm import Mapped, mapped_column

from timekeeper.db.base import Base


class ManagedBudget(Base):
    __tablename__ = "gitops_budgets"

    # The namespace the GPUBudget governs, or "" for the GPUBudgetDefault (the cluster default).
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    kind: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(Text)
    uid: Mapped[str] = mapped_column(Text)
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
