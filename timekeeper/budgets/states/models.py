"""What the admission snapshot is made of: each known namespace's last computed state, and one version;
and the history of those states (budget_events)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, CheckConstraint, DateTime, Index, Text, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from timekeeper.db.base import Base


class NamespaceStatus(Base):
    """Every namespace the timekeeper has heard of, with the state it was last computed to be in."""

    __tablename__ = "namespace_status"
    __table_args__ = (
        CheckConstraint("state IN ('in_budget', 'warning', 'exhausted', 'unlimited')", name="state"),
    )

    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    state: Mapped[str] = mapped_column(Text)
    # Each budgeted GPU model's state ({model: state}), decided with `state` from the same figures.
    model_states: Mapped[dict[str, str]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))


class AdmissionVersion(Base):
    """One row: the snapshot version, bumped in the transaction that changes a state or a budget."""

    __tablename__ = "admission_version"
    __table_args__ = (CheckConstraint("id", name="singleton"),)

    id: Mapped[bool] = mapped_column(Boolean, primary_key=True, server_default=text("true"))
    version: Mapped[int] = mapped_column(BigInteger, server_default="1")


class BudgetEvent(Base):
    """A namespace's budget state, or one GPU model's (`model`), changed (old_state NULL: first seen).
    Written by a trigger on namespace_status, so every path that changes a state (a report, an admin
    change, a job) is recorded."""

    __tablename__ = "budget_events"
    __table_args__ = (Index("ix_budget_events_namespace_id", "namespace", "id"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    namespace: Mapped[str] = mapped_column(Text)
    old_state: Mapped[str | None] = mapped_column(Text)
    new_state: Mapped[str] = mapped_column(Text)
    model: Mapped[str | None] = mapped_column(Text)  # a GPU model's budget changed state; NULL: the total's
