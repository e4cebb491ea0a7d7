"""The report a sidecar sends (gpuaccounting.wire.Report) and the usage answers."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, model_validator

from gpuaccounting.wire import BudgetState, GpuStatus
from timekeeper.schemas import (
    Amount,
    ClusterField,
    DecimalNumber,
    NamespaceName,
    OptionalAmount,
    PodName,
    PodUid,
    StoredText,
    Timestamp,
)

# Numbers only as JSON numbers (strict: no "50", no true), within what a GPU can report.
Percent = Annotated[StrictFloat, Field(ge=0, le=100)]
Bytes = Annotated[StrictInt, Field(ge=0, le=2**62)]
# A millionth of a GPU is below any sharing system's smallest slice (1 MiB of an 80 GiB GPU is 1.2e-5);
# the configured max_gpu_share is checked too (usage/service.py), this bound keeps the arithmetic sane.
MIN_GPU_SHARE = Decimal("0.000001")
MAX_GPU_SHARE = Decimal(10_000)


class GpuFiguresIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    uuid: StoredText = Field(min_length=1, max_length=128)
    sm_util_pct: Percent | None = None
    mem_used_bytes: Bytes | None = None
    mem_total_bytes: Bytes | None = None
    sm_util_max_pct: Percent | None = None
    energy_joules: Annotated[StrictFloat, Field(ge=0, le=1e15)] | None = None
    # Added to the wire later (gpuaccounting.wire.GpuMeasurements): how well the GPU could be read, what it
    # is, and this pod's own processes on it where a node agent attributed them. Kept in the ledger's `gpus`.
    status: GpuStatus | None = None
    name: StoredText | None = Field(default=None, max_length=128)
    parent_uuid: StoredText | None = Field(default=None, max_length=128)
    pod_sm_util_pct: Percent | None = None
    pod_sm_util_max_pct: Percent | None = None
    pod_mem_used_bytes: Bytes | None = None
    pod_processes: Annotated[StrictInt, Field(ge=0, le=1_000_000)] | None = None
    # New fields go last: the ledger keeps each entry positionally (stored_gpu).


# The ledger's `gpus` holds each entry as its values in this order, trailing nulls left out: the keys
# repeated on every row were most of a row's bytes (bench/ledger_bytes.py).
GPU_FIELDS = tuple(GpuFiguresIn.model_fields)


def stored_gpu(gpu: GpuFiguresIn) -> list[Any]:
    """A GPU entry as the ledger's `gpus` keeps it: its values in GPU_FIELDS order, without trailing nulls."""
    values = list(gpu.model_dump().values())
    while values and values[-1] is None:
        values.pop()
    return values


def gpu_entry(stored: list[Any]) -> dict[str, Any]:
    """A ledger `gpus` element as the GPU entry it keeps, every field named (None where not sent)."""
    return dict(zip(GPU_FIELDS, stored + [None] * (len(GPU_FIELDS) - len(stored)), strict=True))


class ReportIn(BaseModel):
    """One numbered interval of a pod's GPU use; the shape of gpuaccounting.wire.Report."""

    model_config = ConfigDict(extra="ignore")

    namespace: NamespaceName
    pod: PodName
    pod_uid: PodUid
    seq: StrictInt = Field(ge=0, le=2**63 - 1)
    interval_start: Timestamp
    interval_end: Timestamp
    gpu_share: DecimalNumber = Field(
        ge=MIN_GPU_SHARE,
        le=MAX_GPU_SHARE,
        allow_inf_nan=False,
        json_schema_extra={"minimum": float(MIN_GPU_SHARE), "maximum": float(MAX_GPU_SHARE)},
    )
    gpus: list[GpuFiguresIn] = Field(default_factory=list, max_length=64)
    final: StrictBool = False

    @model_validator(mode="after")
    def _interval_forward(self) -> Self:
        if self.interval_end <= self.interval_start:
            raise ValueError("interval_end must be after interval_start")
        return self


class SilentInterval(ReportIn):
    """Time the reconciler charges for a pod no report covered, at the share the pod was admitted at:
    any positive share admission admits, however small (a report's lower bound is for what sidecars
    state, and would leave such a pod uncharged)."""

    gpu_share: DecimalNumber = Field(gt=0, le=MAX_GPU_SHARE, allow_inf_nan=False)


class ReportAck(BaseModel):
    """gpuaccounting.wire.ReportAck."""

    duplicate: bool
    gpu_minutes: Amount
    state: BudgetState


class UsageRow(BaseModel):
    """One pod, hour or day. Means are weighted by time and count only the time that had the figure; the
    figures are the pod's own where the sidecar could attribute them (docs/timekeeper.md)."""

    key: str
    # What the budget counts: share x time x the GPU model's weight (x utilisation under the measured
    # charge basis); raw: share x time.
    gpu_minutes: Amount
    raw_gpu_minutes: Amount
    reports: int
    mean_sm_util_pct: float | None
    peak_sm_util_pct: float | None
    mean_mem_used_bytes: int | None
    peak_mem_used_bytes: int | None
    energy_joules: float | None
    gpu_statuses: list[GpuStatus]


class UsageOut(BaseModel):
    namespace: str
    cluster: ClusterField = None
    since: datetime
    until: datetime
    group_by: Literal["pod", "workload", "hour", "day", "model"]
    total_gpu_minutes: Amount
    total_raw_gpu_minutes: Amount
    total_mean_sm_util_pct: float | None
    total_peak_sm_util_pct: float | None
    total_mean_mem_used_bytes: int | None
    total_peak_mem_used_bytes: int | None
    total_energy_joules: float | None
    total_gpu_statuses: list[GpuStatus]
    rows: list[UsageRow]


class PodEfficiencyOut(BaseModel):
    """A pod's allocated GPU-minutes beside what it used of them (docs/timekeeper.md#efficiency)."""

    pod: str
    allocated_gpu_minutes: Amount
    measured_gpu_minutes: Amount  # the allocation of the time that had a utilisation measurement
    utilised_gpu_minutes: Amount  # that allocation x its mean SM utilisation
    efficiency: OptionalAmount  # utilised / measured; null without measurements


class EfficiencyOut(BaseModel):
    namespace: str
    cluster: ClusterField = None
    since: datetime
    until: datetime
    allocated_gpu_minutes: Amount
    measured_gpu_minutes: Amount
    utilised_gpu_minutes: Amount
    efficiency: OptionalAmount
    pods: list[PodEfficiencyOut]


class IdlePodOut(BaseModel):
    namespace: str
    cluster: ClusterField = None
    pod: str
    pod_uid: str
    gpu_share: Amount
    held_since: datetime  # the start of its charged time
    window_gpu_minutes: Amount  # allocated inside the report's window
    mean_sm_util_pct: Amount  # over the window's time that had the measurement


class IdleReportOut(BaseModel):
    """Running pods that have held GPUs for at least `held_for_seconds` and used less than
    `below_sm_util_pct` of them over the last `held_for_seconds` (pods without figures are not judged)."""

    generated_at: datetime
    held_for_seconds: float
    below_sm_util_pct: Amount
    pods: list[IdlePodOut]
