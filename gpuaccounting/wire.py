"""The report wire format: what a sidecar sends to `POST /api/v1/reports` and what it gets back.

Kept as plain typed dictionaries so the sidecar (stdlib only) and the timekeeper (pydantic) build and
read exactly the same shape from one definition.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal, NotRequired, TypedDict

BudgetState = Literal["in_budget", "warning", "exhausted", "unlimited"]
BUDGET_STATES: tuple[BudgetState, ...] = ("in_budget", "warning", "exhausted", "unlimited")


class GpuFigures(TypedDict):
    """One GPU's measured figures over a report interval; None where the driver could not say."""

    uuid: str
    sm_util_pct: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    sm_util_max_pct: NotRequired[float | None]
    energy_joules: NotRequired[float | None]


class Report(TypedDict):
    """One numbered interval of a pod's GPU use. `(pod_uid, seq)` identifies it for idempotency."""

    namespace: str
    pod: str
    pod_uid: str
    seq: int
    interval_start: str
    interval_end: str
    gpu_share: float
    gpus: list[GpuFigures]
    final: bool


class ReportAck(TypedDict):
    """The timekeeper's answer: what was charged and the namespace's state afterwards."""

    duplicate: bool
    gpu_minutes: float
    state: BudgetState


def format_timestamp(moment: datetime) -> str:
    """RFC 3339 in UTC with microseconds, the one timestamp form on the wire."""
    if moment.tzinfo is None:
        raise ValueError("timestamps on the wire must be timezone-aware")
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_timestamp(text: str) -> datetime:
    """Parse an RFC 3339 timestamp; naive timestamps are refused rather than guessed."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no UTC offset")
    return moment.astimezone(UTC)


def build_report(
    *,
    namespace: str,
    pod: str,
    pod_uid: str,
    seq: int,
    interval_start: datetime,
    interval_end: datetime,
    gpu_share: float,
    gpus: list[GpuFigures],
    final: bool = False,
) -> Report:
    """Build a report body exactly as the timekeeper expects it."""
    return Report(
        namespace=namespace,
        pod=pod,
        pod_uid=pod_uid,
        seq=seq,
        interval_start=format_timestamp(interval_start),
        interval_end=format_timestamp(interval_end),
        gpu_share=gpu_share,
        gpus=gpus,
        final=final,
    )
