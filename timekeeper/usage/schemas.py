"""The report a sidecar sends (gpuaccounting.wire.Report) and the usage answers."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal, Self

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from gpuaccounting.wire import BudgetState
from timekeeper.schemas import Amount, NamespaceName, PodName, PodUid, StoredText

Percent = Annotated[float, Field(ge=0, le=100)]
Bytes = Annotated[int, Field(ge=0, le=2**62)]


class GpuFiguresIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    uuid: StoredText = Field(min_length=1, max_length=128)
    sm_util_pct: Percent | None = None
    mem_used_bytes: Bytes | None = None
    mem_total_bytes: Bytes | None = None
    sm_util_max_pct: Percent | None = None
    energy_joules: Annotated[float, Field(ge=0)] | None = None


class ReportIn(BaseModel):
    """One numbered interval of a pod's GPU use; the shape of gpuaccounting.wire.Report."""

    model_config = ConfigDict(extra="ignore")

    namespace: NamespaceName
    pod: PodName
    pod_uid: PodUid
    seq: int = Field(ge=0, le=2**63 - 1)
    interval_start: AwareDatetime
    interval_end: AwareDatetime
    gpu_share: Decimal = Field(gt=0, allow_inf_nan=False)
    gpus: list[GpuFiguresIn] = Field(default_factory=list, max_length=64)
    final: bool = False

    @model_validator(mode="after")
    def _interval_forward(self) -> Self:
        if self.interval_end <= self.interval_start:
            raise ValueError("interval_end must be after interval_start")
        return self

    def measured(self) -> tuple[int, float | None, int | None]:
        """(GPU count, mean SM utilisation, largest memory used) over the GPUs the sidecar could read."""
        utils = [gpu.sm_util_pct for gpu in self.gpus if gpu.sm_util_pct is not None]
        memory = [gpu.mem_used_bytes for gpu in self.gpus if gpu.mem_used_bytes is not None]
        return len(self.gpus), (sum(utils) / len(utils) if utils else None), (max(memory) if memory else None)


class ReportAck(BaseModel):
    """gpuaccounting.wire.ReportAck."""

    duplicate: bool
    gpu_minutes: Amount
    state: BudgetState


class UsageRow(BaseModel):
    key: str
    gpu_minutes: Amount
    reports: int
    mean_sm_util_pct: float | None


class UsageOut(BaseModel):
    namespace: str
    since: datetime
    until: datetime
    group_by: Literal["pod", "hour", "day"]
    total_gpu_minutes: Amount
    rows: list[UsageRow]
