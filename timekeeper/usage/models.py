"""The usage ledger's raw rows (kept briefly), the per-pod hourly aggregates and the daily ones they are
folded into (together the history), and per pod the time already charged (what makes every report count
once, whether or not its raw row is kept)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Identity,
    Index,
    Integer,
    Numeric,
    SmallInteger,
    Text,
    UniqueConstraint,
    and_,
    func,
    not_,
    or_,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, TSTZMULTIRANGE
from sqlalchemy.orm import Mapped, mapped_column

from timekeeper.budgets.models import GPU_MINUTES
from timekeeper.db.base import Base


class LedgerEntry(Base):
    """One accepted report interval: what was charged (and exactly which time) beside what was measured.
    Partitioned by UTC day of interval_end (usage/partitions.py): a retry lands beside its first."""

    __tablename__ = "usage_ledger"
    __table_args__ = (
        # Same seq and same interval is a retry; a re-used seq with another interval is new data.
        UniqueConstraint("pod_uid", "seq", "interval_start", "interval_end", name="uq_usage_ledger_report"),
        # Recent windows (the forecast's burn, the current period's usage) ask for rows ending after a moment.
        Index("ix_usage_ledger_namespace_interval_end", "namespace", "interval_end"),
        # For the roll-up's "ended before the cutoff": BRIN, nearly free on inserts in time order.
        Index("ix_usage_ledger_interval_end", "interval_end", postgresql_using="brin"),
        {"postgresql_partition_by": "RANGE (interval_end)"},
    )

    # The key of a partitioned table includes its partition key.
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    namespace: Mapped[str] = mapped_column(Text)
    pod: Mapped[str] = mapped_column(Text)
    pod_uid: Mapped[str] = mapped_column(Text)
    seq: Mapped[int] = mapped_column(BigInteger)
    interval_start: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    interval_end: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    gpu_share: Mapped[Decimal] = mapped_column(Numeric)
    charged: Mapped[Any] = mapped_column(TSTZMULTIRANGE)
    gpu_minutes: Mapped[Decimal] = mapped_column(GPU_MINUTES)
    final: Mapped[bool] = mapped_column(Boolean)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    mean_sm_util_pct: Mapped[Decimal | None] = mapped_column(Numeric(6, 3))
    # Each GPU entry of the report as its values in order (usage/schemas.py: stored_gpu, gpu_entry).
    gpus: Mapped[Any] = mapped_column(JSONB)
    # The figures the usage answers add up (domain/measurements.py): per second of charged time, utilisation,
    # memory on all the pod's GPUs and mean power; the GPU statuses seen as one bit each.
    peak_sm_util_pct: Mapped[Decimal | None] = mapped_column(Numeric(6, 3))
    mem_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    mean_power_w: Mapped[Decimal | None] = mapped_column(Numeric)
    gpu_status_bits: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))
    # What the budget is charged per second of charged time, before the GPU model's weight: gpu_share under
    # the allocation basis, gpu_share x max(floor, utilisation) under the measured one (billing/).
    charge_share: Mapped[Decimal] = mapped_column(Numeric)
    # The pod's GPU model (domain/weights.py's model_key) when known at ingest; None counts weight 1.
    gpu_model: Mapped[str | None] = mapped_column(Text)


class UsageModel(Base):
    """The GPU models charged, each a small key the hourly aggregates hold instead of its name."""

    __tablename__ = "usage_models"

    id: Mapped[int] = mapped_column(SmallInteger, Identity(), primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)


class UsagePodHour(Base):
    """A pod's charge in one UTC hour at one share, charge share and model: written by ingest in the
    transaction that extends the pod's coverage, so it is the history every usage answer, the export and
    the budgets' rebuild read (raw ledger rows are kept only briefly). The charged time (clipped to the
    hour) is kept as a multirange, so GPU-minutes, raw (gpu_share) and weighted (charge_share x the
    model's weight), are computed from it exactly as from raw rows. Keys, not text: the pod (its
    pod_coverage row's id, which names its namespace, pod and pod_uid) and the model (usage_models.id).
    Not foreign keys: only ingest writes them, from the rows it just read, and a foreign key's check
    would lock the one row of a model in every batch."""

    __tablename__ = "usage_pod_hours"
    __table_args__ = (
        UniqueConstraint(
            "pod_key",
            "hour_start",
            "gpu_share",
            "charge_share",
            "model_key",
            name="uq_usage_pod_hours_key",
            postgresql_nulls_not_distinct=True,
        ),
        # Reads of every namespace over a window (the export) and the fold's hours (periodic/): a btree, as
        # the fold deletes old hours and new ones reuse their space, so the table's order is not time's.
        Index("ix_usage_pod_hours_hour_start", "hour_start"),
    )
    # Every report updates its pod's row of the hour: the table's fillfactor (90, set by migration
    # 9a4c6e2f1b37; SQLAlchemy's tables take no storage parameters) leaves room on each page, so those
    # updates stay HOT (no new index entries), for a tenth more of the table.

    # No surrogate key (the unique key is the row's identity; a usage read groups a row's pieces by ctid);
    # the ORM is told the key, as the table has no primary key (model_key may be NULL).
    __mapper_args__ = {"primary_key": ["pod_key", "hour_start", "gpu_share", "charge_share", "model_key"]}

    pod_key: Mapped[int] = mapped_column(Integer)
    hour_start: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    gpu_share: Mapped[Decimal] = mapped_column(Numeric)
    # What the budget is charged per second before the model's weight (as on a ledger row, LedgerEntry).
    charge_share: Mapped[Decimal] = mapped_column(Numeric)
    model_key: Mapped[int | None] = mapped_column(SmallInteger)
    charged: Mapped[Any] = mapped_column(TSTZMULTIRANGE)
    reports: Mapped[int] = mapped_column(Integer)  # a report counts once in each hour its charge touches
    # Of those, the reports with charged time in an earlier hour too: a usage bucket holding both hours
    # counts them once (usage/repository.py _reports_in), as raw rows would.
    reports_continued: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))
    # The reports' figures as sums that fold exactly (domain/measurements.py): figure x seconds beside the
    # seconds that had the figure, maxima, energy, the statuses seen.
    util_seconds: Mapped[Decimal | None] = mapped_column(Numeric)
    util_covered_seconds: Mapped[Decimal] = mapped_column(Numeric, server_default=text("0"))
    peak_sm_util_pct: Mapped[Decimal | None] = mapped_column(Numeric(6, 3))
    mem_byte_seconds: Mapped[Decimal | None] = mapped_column(Numeric)
    mem_covered_seconds: Mapped[Decimal] = mapped_column(Numeric, server_default=text("0"))
    peak_mem_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    energy_joules: Mapped[Decimal | None] = mapped_column(Numeric)
    gpu_status_bits: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))


class UsagePodDay(Base):
    """UsagePodHour's rows older than TIMEKEEPER_HOURLY_HISTORY, folded by the roll-up job into their UTC
    day: the same key, columns and sums (a report counts once in the day; reports_continued: those with
    charged time in the day before), so charges stay exact and the figures fold as the hours' do. Readers
    read both tables as one history (the usage_history function, migration 7d3a5c1e9f62)."""

    __tablename__ = "usage_pod_days"
    __table_args__ = (
        UniqueConstraint(
            "pod_key",
            "day_start",
            "gpu_share",
            "charge_share",
            "model_key",
            name="uq_usage_pod_days_key",
            postgresql_nulls_not_distinct=True,
        ),
        # Written in day order and only updated after (by a late hour's fold): a BRIN stays selective.
        Index("ix_usage_pod_days_day_start", "day_start", postgresql_using="brin"),
    )
    # Fillfactor 90 (migration 7d3a5c1e9f62), as usage_pod_hours: the fold updates a day's row each hour.
    __mapper_args__ = {"primary_key": ["pod_key", "day_start", "gpu_share", "charge_share", "model_key"]}

    pod_key: Mapped[int] = mapped_column(Integer)
    day_start: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    gpu_share: Mapped[Decimal] = mapped_column(Numeric)
    charge_share: Mapped[Decimal] = mapped_column(Numeric)
    model_key: Mapped[int | None] = mapped_column(SmallInteger)
    charged: Mapped[Any] = mapped_column(TSTZMULTIRANGE)
    reports: Mapped[int] = mapped_column(Integer)
    reports_continued: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))
    util_seconds: Mapped[Decimal | None] = mapped_column(Numeric)
    util_covered_seconds: Mapped[Decimal] = mapped_column(Numeric, server_default=text("0"))
    peak_sm_util_pct: Mapped[Decimal | None] = mapped_column(Numeric(6, 3))
    mem_byte_seconds: Mapped[Decimal | None] = mapped_column(Numeric)
    mem_covered_seconds: Mapped[Decimal] = mapped_column(Numeric, server_default=text("0"))
    peak_mem_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    energy_joules: Mapped[Decimal | None] = mapped_column(Numeric)
    gpu_status_bits: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))


class PodCoverage(Base):
    """The time of each pod already charged; its row lock serialises one pod's reports."""

    __tablename__ = "pod_coverage"
    __table_args__ = (Index("ix_pod_coverage_namespace", "namespace"),)

    pod_uid: Mapped[str] = mapped_column(Text, primary_key=True)
    # The pod's small key, which its hourly aggregates (UsagePodHour) hold instead of its names.
    id: Mapped[int] = mapped_column(Integer, Identity(), unique=True)
    namespace: Mapped[str] = mapped_column(Text)
    pod: Mapped[str] = mapped_column(Text)
    covered: Mapped[Any] = mapped_column(TSTZMULTIRANGE)
    last_seq: Mapped[int] = mapped_column(BigInteger)
    last_report_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    final: Mapped[bool] = mapped_column(Boolean)
    # Set by the close-out job when the pod stopped reporting; a later report (last_report_at from then on)
    # makes the pod running again.
    closed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The GPU model the pod got, from whichever source named it first: the node's GPU Feature Discovery
    # label (the reconciler) or the sidecar's NVML device name (a report). Fixed once known.
    gpu_model: Mapped[str | None] = mapped_column(Text)
    # The GPU share admission admitted the pod at (the webhook's annotation, else its GPU requests; 0: it
    # holds no GPU), from the pod watch or a read of the pod: what its time is charged at, whatever a
    # report states. Fixed once known; None: not known (static auth mode charges the reported share).
    admitted_share: Mapped[Decimal | None] = mapped_column(Numeric)
    # When a report first stated another share than the admitted one (logged then, once per pod).
    share_mismatch_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The workload the pod belongs to (the webhook's gpu-timekeeper.io/workload annotation, `Job/train`),
    # from the pod watch; None: a bare pod, or not known (usage by workload counts it as `Pod/<name>`).
    workload: Mapped[str | None] = mapped_column(Text)


# A pod counts as running until it sent its final report or was closed out after its last report.
RUNNING_POD = and_(
    not_(PodCoverage.final),
    or_(PodCoverage.closed_at.is_(None), PodCoverage.closed_at <= PodCoverage.last_report_at),
)
