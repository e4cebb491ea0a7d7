"""Pools: a budget several namespaces share (listed members, each with an optional cap inside it)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import CheckConstraint, DateTime, ForeignKey, Index, Numeric, Text, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from timekeeper.budgets.models import GPU_MINUTES, MODEL_POLICIES_SQL, MODELS_IS_OBJECT_SQL, PERIOD_KINDS_SQL
from timekeeper.db.base import Base
from timekeeper.domain.clusters import SEPARATOR


class BudgetPool(Base):
    """While a namespace is a member, the pool's budget, period and warning fraction govern its state
    (its own budget or the default does not), together with its cap where it has one."""

    __tablename__ = "budget_pools"
    __table_args__ = (
        CheckConstraint(PERIOD_KINDS_SQL, name="period_kind"),
        CheckConstraint("warn_at_fraction > 0 AND warn_at_fraction <= 1", name="warn_fraction"),
        CheckConstraint("budget_gpu_minutes >= 0", name="budget_not_negative"),
        CheckConstraint(
            "namespace_selector IS NULL OR jsonb_typeof(namespace_selector) = 'object'",
            name="selector_object",
        ),
        CheckConstraint(MODELS_IS_OBJECT_SQL, name="models_object"),
        CheckConstraint(MODEL_POLICIES_SQL, name="model_policy"),
    )

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    budget_gpu_minutes: Mapped[Decimal] = mapped_column(GPU_MINUTES)
    period: Mapped[str] = mapped_column(Text)
    warn_at_fraction: Mapped[Decimal] = mapped_column(Numeric(5, 4))
    # matchLabels: namespaces whose labels (as the reconciler last saw them) hold all of these are members.
    namespace_selector: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    models: Mapped[dict[str, str] | None] = mapped_column(JSONB)  # as budgets/models.py's
    model_policy: Mapped[str] = mapped_column(Text, server_default="reduce")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_by: Mapped[str] = mapped_column(Text)


class PoolMember(Base):
    """A listed member: a namespace is in at most one pool by listing (the primary key)."""

    __tablename__ = "budget_pool_members"
    __table_args__ = (
        CheckConstraint("cap_gpu_minutes IS NULL OR cap_gpu_minutes >= 0", name="cap_not_negative"),
        Index("ix_budget_pool_members_pool", "pool"),
    )

    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    pool: Mapped[str] = mapped_column(Text, ForeignKey("budget_pools.name", ondelete="CASCADE"))
    cap_gpu_minutes: Mapped[Decimal | None] = mapped_column(GPU_MINUTES)


class NamespaceLabels(Base):
    """Each namespace's labels as the reconciler last listed them, for the pools' selectors."""

    __tablename__ = "namespace_labels"
    __table_args__ = (Index("ix_namespace_labels_labels", "labels", postgresql_using="gin"),)

    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    labels: Mapped[dict[str, str]] = mapped_column(JSONB)
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


# Whether the namespace key `{key}` (an SQL expression) is of the hub's own cluster (domain/clusters.py).
LOCAL_KEY_SQL = f"strpos({{key}}, '{SEPARATOR}') = 0"


def membership_sql(namespace: str | None = None) -> str:
    """Every namespace in a pool, with its pool and cap: its listing when listed (a listing wins), else
    the first pool by name whose selector its labels match; one rule, wherever a budget is resolved. With
    `namespace` (an SQL expression), that one namespace's membership by key; without, every member.
    A selector chooses among the hub's own cluster's namespaces only: a member cluster's labels are its
    admin's to write, and would let it join a pool (docs/fleet.md#pools-across-clusters)."""
    member = "" if namespace is None else f" WHERE m.namespace = {namespace}"
    labelled = "" if namespace is None else f" AND l.namespace = {namespace}"
    rows = (
        f"SELECT m.namespace, m.pool, m.cap_gpu_minutes, 0 AS rank FROM budget_pool_members m{member} "
        "UNION ALL SELECT l.namespace, p.name, NULL, 1 FROM namespace_labels l JOIN budget_pools p "
        f"ON p.namespace_selector IS NOT NULL AND l.labels @> p.namespace_selector{labelled} "
        f"AND {LOCAL_KEY_SQL.format(key='l.namespace')}"
    )
    if namespace is None:
        return (
            f"(SELECT DISTINCT ON (x.namespace) x.namespace, x.pool, x.cap_gpu_minutes FROM ({rows}) x "
            "ORDER BY x.namespace, x.rank, x.pool)"
        )
    return f"(SELECT x.namespace, x.pool, x.cap_gpu_minutes FROM ({rows}) x ORDER BY x.rank, x.pool LIMIT 1)"


MEMBERSHIP_SQL = membership_sql()
