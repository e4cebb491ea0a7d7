"""Weights, prices and the charge basis as the API takes and answers them."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field

from timekeeper.domain.weights import ChargeBasisKind
from timekeeper.schemas import Amount, DecimalIn, Timestamp

# A GPU model as NVML or GPU Feature Discovery spell it ("NVIDIA H100 80GB HBM3", "NVIDIA-A100-SXM4-40GB-
# MIG-1g.5gb"); stored as domain.weights.model_key spells it.
ModelPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._()+-]*$",
        description="a GPU model, e.g. NVIDIA-H100-80GB-HBM3 or NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
    ),
]


class WeightIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weight: DecimalIn = Field(gt=0, le=1000, decimal_places=6, allow_inf_nan=False)
    # Omitted: as soon as no report already charged can reach (now + the clock-skew allowance). Never in
    # the past: time already charged is never re-weighted.
    effective_from: Timestamp | None = None


class WeightOut(BaseModel):
    model: str
    weight: Amount
    effective_from: datetime
    set_by: str


class WeightsOut(BaseModel):
    """The weights in force now (a model absent counts 1), and changes already set for later."""

    weights: list[WeightOut]
    scheduled: list[WeightOut]


class PriceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    price_per_gpu_hour: DecimalIn = Field(ge=0, le=Decimal("1e9"), decimal_places=6, allow_inf_nan=False)


class PriceOut(BaseModel):
    model: str
    price_per_gpu_hour: Amount
    currency: str
    updated_at: datetime
    updated_by: str


class ChargeBasisIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    basis: ChargeBasisKind
    # Under `measured`, a pod is charged at least this fraction of its allocation, however idle.
    floor: DecimalIn = Field(default=Decimal("0.1"), ge=0, le=1, decimal_places=2)


class ChargeBasisOut(BaseModel):
    basis: ChargeBasisKind
    floor: Amount
    source: Literal["namespace", "cluster", "shipped"]
