"""The audit log: every admin change, who made it, when, and the value before and after."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Index, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from timekeeper.db.base import Base


class AuditEntry(Base):
    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_namespace_at", "namespace", "at"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    actor: Mapped[str] = mapped_column(Text)
    # The member cluster whose API server authenticated the actor (NULL: the hub's own cluster, or the
    # timekeeper itself): `alice` of the hub and `alice` of member `b` are different people.
    actor_cluster: Mapped[str | None] = mapped_column(Text)
    action: Mapped[str] = mapped_column(Text)
    namespace: Mapped[str | None] = mapped_column(Text)
    old_value: Mapped[Any] = mapped_column(JSONB, nullable=True)
    new_value: Mapped[Any] = mapped_column(JSONB, nullable=True)
