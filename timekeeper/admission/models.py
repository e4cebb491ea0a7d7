"""What the admission snapshot is made of: each known namespace's last computed state, and one version."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, CheckConstraint, Text, text
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


class AdmissionVersion(Base):
    """One row: the snapshot version, bumped in the transaction that changes a state or a budget."""

    __tablename__ = "admission_version"
    __table_args__ = (CheckConstraint("id", name="singleton"),)

    id: Mapped[bool] = mapped_column(Boolean, primary_key=True, server_default=text("true"))
    version: Mapped[int] = mapped_column(BigInteger, server_default="1")
