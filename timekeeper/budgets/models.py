"""Budgets (one per namespace, and the cluster-wide default), grants and the per-period running totals."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import Any, get_args

from sqlalchemy import BigInteger, Boolean, CheckConstraint, DateTime, Index, Numeric, Text, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from gpuaccounting.admission_state import default_priority_policy
from timekeeper.db.base import Base
from timekeeper.domain.figures import SHIPPED_RUNNING_POD_ACTION, RunningPodAction

GPU_MINUTES = Numeric(24, 9)  # exact, to the nano-GPU-minute
PERIOD_KINDS_SQL = "period IN ('daily', 'weekly', 'monthly', 'none')"
RUNNING_POD_ACTIONS_SQL = f"running_pod_action IN {tuple(get_args(RunningPodAction))}"
POLICY_IS_OBJECT_SQL = "jsonb_typeof(priority_policy) = 'object'"
# Per-model budgets (docs/timekeeper.md): a JSON object from a model (as domain/weights.py model_key spells
# it) to its GPU-minutes for the period, as a decimal string; NULL: none. And what the webhook does with a
# pod that could land on an exhausted model.
MODELS_IS_OBJECT_SQL = "models IS NULL OR jsonb_typeof(models) = 'object'"
MODEL_POLICIES_SQL = "model_policy IN ('reduce', 'steer')"
SHIPPED_POLICY_SQL = f"'{json.dumps(default_priority_policy())}'::jsonb"


class _BudgetColumns:
    budget_gpu_minutes: Mapped[Decimal | None] = mapped_column(GPU_MINUTES)
    period: Mapped[str] = mapped_column(Text)
    warn_at_fraction: Mapped[Decimal] = mapped_column(Numeric(5, 4))
    max_gpu_share_per_pod: Mapped[Decimal | None] = mapped_column(Numeric)
    concurrent_gpu_limit: Mapped[Decimal | None] = mapped_column(Numeric)
    models: Mapped[dict[str, str] | None] = mapped_column(JSONB)
    model_policy: Mapped[str] = mapped_column(Text, server_default="reduce")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_by: Mapped[str] = mapped_column(Text, server_default="system")


class NamespaceBudget(_BudgetColumns, Base):
    __tablename__ = "namespace_budgets"
    __table_args__ = (
        CheckConstraint(PERIOD_KINDS_SQL, name="period_kind"),
        CheckConstraint("warn_at_fraction > 0 AND warn_at_fraction <= 1", name="warn_fraction"),
        CheckConstraint(RUNNING_POD_ACTIONS_SQL, name="running_pod_action"),
        CheckConstraint(POLICY_IS_OBJECT_SQL, name="priority_policy_object"),
        CheckConstraint(MODELS_IS_OBJECT_SQL, name="models_object"),
        CheckConstraint(MODEL_POLICIES_SQL, name="model_policy"),
    )

    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    # NULL: the namespace follows the default's (the budget API's "inherit").
    priority_policy: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    running_pod_action: Mapped[str | None] = mapped_column(Text)


class DefaultBudget(_BudgetColumns, Base):
    """Exactly one row (id = true): the budget of every namespace without its own."""

    __tablename__ = "default_budget"
    __table_args__ = (
        CheckConstraint("id", name="singleton"),
        CheckConstraint(PERIOD_KINDS_SQL, name="period_kind"),
        CheckConstraint("warn_at_fraction > 0 AND warn_at_fraction <= 1", name="warn_fraction"),
        CheckConstraint(RUNNING_POD_ACTIONS_SQL, name="running_pod_action"),
        CheckConstraint(POLICY_IS_OBJECT_SQL, name="priority_policy_object"),
        CheckConstraint(MODELS_IS_OBJECT_SQL, name="models_object"),
        CheckConstraint(MODEL_POLICIES_SQL, name="model_policy"),
    )

    id: Mapped[bool] = mapped_column(Boolean, primary_key=True, server_default=text("true"))
    priority_policy: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text(SHIPPED_POLICY_SQL))
    running_pod_action: Mapped[str] = mapped_column(Text, server_default=SHIPPED_RUNNING_POD_ACTION)


class Grant(Base):
    """A one-off top-up, counted in the period it was granted in until it ends (revoked, or `expires_at`
    passed: `ended_at` says when). The running totals count exactly the grants not ended."""

    __tablename__ = "grants"
    __table_args__ = (
        CheckConstraint("gpu_minutes > 0", name="positive"),
        CheckConstraint("expires_at IS NULL OR expires_at > granted_at", name="expires_after_granted"),
        CheckConstraint("(revoked_at IS NULL) = (revoked_by IS NULL)", name="revoked_by_someone"),
        CheckConstraint("revoked_at IS NULL OR ended_at IS NOT NULL", name="revoked_is_ended"),
        Index("ix_grants_namespace_granted_at", "namespace", "granted_at"),
        # The sweep's "expired but still counted": only grants with an expiry still running.
        Index(
            "ix_grants_expires_at_running",
            "expires_at",
            postgresql_where=text("ended_at IS NULL AND expires_at IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    namespace: Mapped[str] = mapped_column(Text)
    gpu_minutes: Mapped[Decimal] = mapped_column(GPU_MINUTES)
    reason: Mapped[str] = mapped_column(Text)
    granted_by: Mapped[str] = mapped_column(Text)
    granted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_by: Mapped[str | None] = mapped_column(Text)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class UsageTotal(Base):
    """Running totals per namespace and period, updated in the ledger row's transaction; keyed by period
    kind too, so a namespace whose period changes gets a fresh row rebuilt from the ledger."""

    __tablename__ = "usage_totals"

    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    period_kind: Mapped[str] = mapped_column(Text, primary_key=True)
    period_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    used_gpu_minutes: Mapped[Decimal] = mapped_column(GPU_MINUTES, server_default="0")
    granted_gpu_minutes: Mapped[Decimal] = mapped_column(GPU_MINUTES, server_default="0")


class UsageModelTotal(Base):
    """RAW GPU-minutes (admitted share x charged time, before weights) per namespace, period and the GPU
    model the pod was known by when charged ('': not known), updated in the charge's transaction as
    usage_totals is; the per-model budgets are read from here."""

    __tablename__ = "usage_model_totals"

    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    period_kind: Mapped[str] = mapped_column(Text, primary_key=True)
    period_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    model: Mapped[str] = mapped_column(Text, primary_key=True)
    used_gpu_minutes: Mapped[Decimal] = mapped_column(GPU_MINUTES, server_default="0")


class UsageBurn(Base):
    """GPU-minutes charged per namespace in 5-minute buckets (budgets/burn.py), kept with the ledger
    rows; the roll-up job purges buckets older than the largest forecast window."""

    __tablename__ = "usage_burn"

    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    bucket_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    gpu_minutes: Mapped[Decimal] = mapped_column(GPU_MINUTES)


class UsageModelBurn(Base):
    """Raw GPU-minutes charged per namespace and known GPU model in the burn's 5-minute buckets (the
    per-model forecast's), written and purged with usage_burn."""

    __tablename__ = "usage_model_burn"

    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    model: Mapped[str] = mapped_column(Text, primary_key=True)
    bucket_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    gpu_minutes: Mapped[Decimal] = mapped_column(GPU_MINUTES)
