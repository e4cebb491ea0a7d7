"""DRA charging stays exact however the passes, the sidecars' reports and changes of leader interleave:
pods sharing claims, a pod with a GPU of its own beside its claim, and a plain GPU pod run at random times;
each step some sidecars report (stating a share of their choosing), some reports are lost, a pass may run
and the leader may change. At the end the ledger holds exactly each claim's devices for the union of its
pods' runs, at its model's weight, plus each pod's own GPUs for its run: nothing twice, nothing missed."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from gpuaccounting.shares import GpuHardware
from tests.kube.factories import dra_pod, gpu_pod, resource_claim, resource_slice
from tests.kube.test_dra_charging import ledger_total
from tests.kube.test_reconcile import GRACE, iso, sync
from tests.support.kube_apiserver import KubeApiServer
from tests.support.timekeeper import report_body
from tests.timekeeper.conftest import START
from timekeeper.billing.repository import BillingRepository
from timekeeper.clock import ManualClock
from timekeeper.kube import KubeClient
from timekeeper.kube.types import pod_info
from timekeeper.reconcile.claims import merged
from timekeeper.reconcile.service import Reconciler
from timekeeper.settings import Settings
from timekeeper.usage.admitted import admitted_share
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import IngestService

pytestmark = pytest.mark.asyncio(loop_scope="session")

STEP = timedelta(minutes=5)
STEPS = 30
T0 = START - STEPS * STEP
WEIGHTS = {"NVIDIA-H100-80GB-HBM3": Decimal(3), "NVIDIA-A100-SXM4-80GB": Decimal(2)}
DEVICES: list[dict[str, Any]] = [
    {"name": "gpu-0", "attributes": {"productName": "NVIDIA H100 80GB HBM3"}},
    {"name": "gpu-1", "attributes": {"productName": "NVIDIA A100-SXM4-80GB"}},
    {"name": "gpu-2", "attributes": {"productName": "NVIDIA A100-SXM4-80GB"}},
]


@dataclass
class Run:
    name: str
    claim: str | None  # the claim it uses (None: a plain GPU pod)
    own: str | None  # the GPUs in its own limits
    start: datetime
    end: datetime
    reported_to: datetime | None = None
    seq: int = 0
    pod: dict[str, Any] | None = None


# (name, claim, device of the claim, own GPUs): two pods sharing the H100, one with the A100 alone, one with
# a GPU of its own beside its claim's, one plain half-GPU pod.
PODS = [
    ("share-a", "h100", "gpu-0", None),
    ("share-b", "h100", "gpu-0", None),
    ("alone", "a100", "gpu-1", None),
    ("both", "extra", "gpu-2", "1"),
    ("plain", None, None, "0.5"),
]


CLAIMS = {claim: device for _, claim, device, _ in PODS if claim is not None and device is not None}


def runs(rng: random.Random) -> list[Run]:
    found = []
    for name, claim, _, own in PODS:
        start = T0 + timedelta(minutes=rng.randrange(0, 60))
        found.append(Run(name, claim, own, start, start + timedelta(minutes=rng.randrange(10, 90))))
    return found


def minutes(spans: list[tuple[datetime, datetime]]) -> Decimal:
    return sum((Decimal((end - start).total_seconds()) / 60 for start, end in spans), Decimal(0))


def truth(all_runs: list[Run]) -> Decimal:
    """Each claim's device for the union of its pods' runs at its model's weight, each pod's own GPUs."""
    total = Decimal(0)
    for name, device in CLAIMS.items():
        model = next(d for d in DEVICES if d["name"] == device)["attributes"]["productName"]
        weight = WEIGHTS["-".join(model.split())]
        total += weight * minutes(merged((r.start, r.end) for r in all_runs if r.claim == name))
    for run in all_runs:
        if run.own is not None:
            total += Decimal(run.own) * minutes([(run.start, run.end)])
    return total


def put_pod(apiserver: KubeApiServer, run: Run, now: datetime) -> None:
    ended = now >= run.end
    times: dict[str, Any] = {
        "started_at": iso(run.start),
        "finished_at": iso(run.end) if ended else None,
        "phase": "Succeeded" if ended else "Running",
    }
    if run.claim is None:
        run.pod = gpu_pod(apiserver, "team-a", run.name, share=run.own, sidecar=True, **times)
        return
    share = str(1 + Decimal(run.own or 0))  # the webhook's: the claim's GPU and its own
    pod = dra_pod(apiserver, "team-a", run.name, run.claim, share=share, **times)
    if run.own is not None:
        pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": run.own}
        pod = apiserver.put(pod)
    run.pod = pod


async def sidecar_report(sessionmaker, run: Run, now: datetime, rng: random.Random, lost: bool) -> None:
    """The sidecar's report of its time since its last one, at a share it states, charged at the share the
    pod was admitted at (as Kubernetes auth mode reads it from the pod); a lost one is retried later."""
    assert run.pod is not None
    start = run.reported_to or run.start
    end = min(now, run.end)
    if end <= start or lost:
        return
    run.seq += 1
    meta = run.pod["metadata"]
    body = report_body(
        namespace="team-a",
        pod=meta["name"],
        pod_uid=meta["uid"],
        seq=run.seq,
        start=start,
        end=end,
        gpu_share=rng.choice([0.000001, 1, 3]),
        final=end == run.end,
    )
    share = admitted_share(pod_info(run.pod), GpuHardware()) or Decimal(0)
    async with sessionmaker() as session, session.begin():
        await IngestService(session, Settings()).charge_one(
            ReportIn.model_validate(body), now, admitted_share=share
        )
    run.reported_to = end


@pytest.fixture
def sessionmaker(connection: AsyncConnection) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(
        bind=connection, expire_on_commit=False, join_transaction_mode="create_savepoint"
    )


@pytest.fixture
def leader_settings(settings: Settings) -> Iterator[Settings]:
    yield settings.model_copy(update={"silent_grace_seconds": GRACE.total_seconds()})


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_claims_and_pods_are_charged_exactly_once_whatever_the_interleaving(
    apiserver: KubeApiServer,
    kube: KubeClient,
    sessionmaker,
    leader_settings: Settings,
    clock: ManualClock,
    seed: int,
):
    rng = random.Random(seed)
    async with sessionmaker() as session, session.begin():
        for model, weight in WEIGHTS.items():
            await BillingRepository(session).set_weight(model, weight, T0 - timedelta(days=1), "admin")
    resource_slice(apiserver, "gpu-node-1", DEVICES)
    all_runs = runs(rng)
    clock.set(T0)
    leader = Reconciler(kube, sessionmaker, leader_settings, clock)
    for _ in range(STEPS * 2):
        clock.advance(STEP)
        now = clock.now()
        for run in all_runs:
            if run.start <= now:
                put_pod(apiserver, run, now)
        for name, device in CLAIMS.items():
            users = [r for r in all_runs if r.claim == name and r.pod is not None and r.start <= now < r.end]
            if any(r.claim == name and r.pod is not None for r in all_runs):
                resource_claim(
                    apiserver, "team-a", name, [device], reserved_for=[u.pod for u in users if u.pod]
                )
        for run in all_runs:
            if run.pod is not None and rng.random() < 0.6:
                await sidecar_report(sessionmaker, run, now, rng, lost=rng.random() < 0.2)
        if rng.random() < 0.15:  # another replica takes the lead: its registries start empty
            leader = Reconciler(kube, sessionmaker, leader_settings, clock)
        if rng.random() < 0.5:
            await sync(leader)
            await leader.run_pass()
    for name in CLAIMS:  # the pods are long gone: so are their claims
        apiserver.remove("resource.k8s.io/v1", "ResourceClaim", "team-a", name)
    clock.advance(GRACE + STEP)
    for _ in range(2):
        await sync(leader)
        await leader.run_pass()

    assert await ledger_total(sessionmaker) == truth(all_runs)
