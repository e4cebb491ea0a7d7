"""What the periodic jobs keep: one row per job and window, and the hourly per-pod aggregates that old
ledger rows are folded into."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Index,
    Integer,
    Numeric,
    SmallInteger,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, TSTZMULTIRANGE
from sqlalchemy.orm import Mapped, mapped_column

from timekeeper.db.base import Base


class JobRun(Base):
    """A job's execution for one window, inserted in the transaction that makes the job's effect: a second
    run of the same window finds the row (or waits on the first run's uncommitted one) and does nothing."""

    __tablename__ = "job_runs"

    job: Mapped[str] = mapped_column(Text, primary_key=True)
    window_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    ran_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    replica: Mapped[str] = mapped_column(Text)
    detail: Mapped[Any] = mapped_column(JSONB)


class UsageHourly(Base):
    """Ledger rows older than the retention window, folded per pod, hour and share: the charged time
    (clipped to the hour) is kept as a multirange, so usage is computed from it exactly as from raw rows."""

    __tablename__ = "usage_hourly"
    __table_args__ = (
        UniqueConstraint(
            "pod_uid",
            "hour_start",
            "gpu_share",
            "charge_share",
            "gpu_model",
            name="uq_usage_hourly_pod_hour_share",
            postgresql_nulls_not_distinct=True,
        ),
        Index("ix_usage_hourly_namespace_hour_start", "namespace", "hour_start"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    namespace: Mapped[str] = mapped_column(Text)
    pod: Mapped[str] = mapped_column(Text)
    pod_uid: Mapped[str] = mapped_column(Text)
    hour_start: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    gpu_share: Mapped[Decimal] = mapped_column(Numeric)
    charged: Mapped[Any] = mapped_column(TSTZMULTIRANGE)
    reports: Mapped[int] = mapped_column(Integer)
    # The folded reports' figures as sums that fold again exactly (domain/measurements.py): figure x seconds
    # beside the seconds that had the figure, maxima, energy, the statuses seen.
    util_seconds: Mapped[Decimal | None] = mapped_column(Numeric)
    util_covered_seconds: Mapped[Decimal] = mapped_column(Numeric, server_default=text("0"))
    peak_sm_util_pct: Mapped[Decimal | None] = mapped_column(Numeric(6, 3))
    mem_byte_seconds: Mapped[Decimal | None] = mapped_column(Numeric)
    mem_covered_seconds: Mapped[Decimal] = mapped_column(Numeric, server_default=text("0"))
    peak_mem_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    energy_joules: Mapped[Decimal | None] = mapped_column(Numeric)
    gpu_status_bits: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))
    # As on the ledger rows folded (usage/models.py): an aggregate holds rows of one charge rate and model.
    charge_share: Mapped[Decimal] = mapped_column(Numeric)
    gpu_model: Mapped[str | None] = mapped_column(Text)
