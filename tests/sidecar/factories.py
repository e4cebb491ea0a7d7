"""Reports as the sidecar cuts them, for the tests of what happens to them next (buffering, sending)."""

from __future__ import annotations

from typing import Any

from gpuaccounting.clock import to_datetime
from gpuaccounting.wire import build_report


def pod_report(
    seq: int, start_us: int, end_us: int, gpus: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """team-a/p's report (half a GPU) for [start_us, end_us), in microseconds since the epoch."""
    return build_report(
        namespace="team-a",
        pod="p",
        pod_uid="pod-uid",
        seq=seq,
        interval_start=to_datetime(start_us),
        interval_end=to_datetime(end_us),
        gpu_share=0.5,
        gpus=gpus or [],
    )
