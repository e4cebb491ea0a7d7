"""The report wire format (`POST /api/v1/reports` and its answer), as plain typed dictionaries, so the sidecar
(standard library only) and the timekeeper (pydantic) read one definition."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal, NotRequired, TypedDict, cast

BudgetState = Literal["in_budget", "warning", "exhausted", "unlimited"]
BUDGET_STATES: tuple[BudgetState, ...] = ("in_budget", "warning", "exhausted", "unlimited")

# How well a GPU could be read over an interval, best first: every measurement; some not supported here
# (MIG utilisation, energy on older boards...); none supported; the NVML library or node agent could not be
# reached; the GPU stopped answering (fell off the bus, reset required).
GpuStatus = Literal["ok", "partial", "not_supported", "unavailable", "lost"]
GPU_STATUSES: tuple[GpuStatus, ...] = ("ok", "partial", "not_supported", "unavailable", "lost")


def worst_status(statuses: list[GpuStatus]) -> GpuStatus:
    """An interval's status is the worst any of its samples had ("ok" when there were none)."""
    return max(statuses, key=GPU_STATUSES.index, default="ok")


class GpuMeasurements(TypedDict):
    """One GPU's measurements over a report interval; None where the driver could not say. Device-wide
    ones include every tenant; `pod_*` are this pod's processes, where a node agent mapped them. Fields
    after the first four came later: readers treat them as optional."""

    uuid: str
    sm_util_pct: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    sm_util_max_pct: NotRequired[float | None]
    energy_joules: NotRequired[float | None]
    status: NotRequired[GpuStatus]
    name: NotRequired[str | None]
    parent_uuid: NotRequired[str | None]
    pod_sm_util_pct: NotRequired[float | None]
    pod_sm_util_max_pct: NotRequired[float | None]
    pod_mem_used_bytes: NotRequired[int | None]
    pod_processes: NotRequired[int | None]


# Added fields sent only when known, so reports stay small and a sidecar that cannot tell sends the v1 shape.
_SENT_WHEN_KNOWN = (
    "name",
    "parent_uuid",
    "pod_sm_util_pct",
    "pod_sm_util_max_pct",
    "pod_mem_used_bytes",
    "pod_processes",
)


def compact_measurements(measured: GpuMeasurements) -> GpuMeasurements:
    """`measured` without the added fields that are None."""
    kept = {k: v for k, v in measured.items() if v is not None or k not in _SENT_WHEN_KNOWN}
    return cast(GpuMeasurements, kept)


class Report(TypedDict):
    """One numbered interval of a pod's GPU use. `(pod_uid, seq)` identifies it for idempotency."""

    namespace: str
    pod: str
    pod_uid: str
    seq: int
    interval_start: str
    interval_end: str
    gpu_share: float
    gpus: list[GpuMeasurements]
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
    gpus: list[GpuMeasurements],
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
