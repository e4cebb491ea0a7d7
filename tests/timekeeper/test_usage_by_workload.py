"""Usage by workload: each workload's GPU-minutes are exactly the sum of its pods' (the pods' workloads as
the reconcile pass records them from the pod watch); a pod with no workload counts as itself."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi import FastAPI

from tests.support.timekeeper import Api, ok
from timekeeper.app import current
from timekeeper.clock import ManualClock
from timekeeper.reconcile.repository import ReconcileRepository

pytestmark = pytest.mark.asyncio(loop_scope="session")

NOON = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
# pod -> (workload, share, minutes of each of its reports); odd shares and times, so rounding would show.
PODS: dict[str, tuple[str | None, str, tuple[float, ...]]] = {
    "train-0": ("Job/train", "0.333", (7.3, 11.1)),
    "train-1": ("Job/train", "0.333", (7.3, 3.7)),
    "train-2": ("Job/train", "1.7", (0.9,)),
    "serve-0": ("LeaderWorkerSet/serve", "0.142857", (13.0, 2.2, 5.5)),
    "serve-1": ("LeaderWorkerSet/serve", "2", (1.01,)),
    "scratch": (None, "0.5", (9.9,)),  # a bare pod
    # One second at a whole GPU is 0.0166… GPU-minutes: each pod's row rounds it up, a sum rounded once
    # would not (0.033333333 for the two, not 0.033333334).
    "tick-0": ("Job/tick", "1", (1 / 60,)),
    "tick-1": ("Job/tick", "1", (1 / 60,)),
}


@pytest.fixture(autouse=True)
def later(clock: ManualClock) -> None:
    clock.set(datetime(2026, 3, 18, 12, tzinfo=UTC))


async def usage(api: Api, group_by: str) -> dict[str, Any]:
    response = await api.get("/namespaces/team-a/usage", group_by=group_by)
    ok(response)
    answer: dict[str, Any] = json.loads(response.text, parse_float=Decimal)
    return answer


async def test_a_workloads_usage_is_exactly_the_sum_of_its_pods(api: Api, app: FastAPI) -> None:
    for pod, (_, share, intervals) in PODS.items():
        start = NOON
        for seq, minutes in enumerate(intervals, start=1):
            report = await api.report(
                pod=pod, pod_uid=f"uid-{pod}", seq=seq, start=start, minutes=minutes, gpu_share=float(share)
            )
            ok(report)
            start += timedelta(minutes=minutes)
    async with current(app).sessions() as session, session.begin():
        named = {f"uid-{pod}": workload for pod, (workload, _, _) in PODS.items() if workload}
        assert await ReconcileRepository(session).record_workloads(named) == set(named)

    by_pod = await usage(api, "pod")
    by_workload = await usage(api, "workload")

    expected: dict[str, Decimal] = defaultdict(Decimal)
    for row in by_pod["rows"]:
        workload = PODS[row["key"]][0] or f"Pod/{row['key']}"
        expected[workload] += Decimal(row["gpu_minutes"])
    assert {row["key"]: Decimal(row["gpu_minutes"]) for row in by_workload["rows"]} == expected
    assert sorted(expected) == ["Job/tick", "Job/train", "LeaderWorkerSet/serve", "Pod/scratch"]
    assert expected["Job/tick"] == Decimal("0.033333334")
    assert Decimal(by_workload["total_gpu_minutes"]) == Decimal(by_pod["total_gpu_minutes"])
    assert sum(row["reports"] for row in by_workload["rows"]) == sum(len(m) for _, _, m in PODS.values())
