"""What the periodic jobs keep: one row per job and window (the hourly aggregates that the roll-up folds
old ledger rows into are usage's: usage/models.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, Text
from sqlalchemy.dialects.postgresql import JSONB
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
