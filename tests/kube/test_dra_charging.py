"""DRA claims charged by the reconcile pass, against the stand-in API server (playing the scheduler's and
the driver's parts: the allocation, `reservedFor` and the ResourceSlices) and the real database: a claim
once whatever the number of its pods, at its devices' share and model weight, never the pod's time as well."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from tests.kube.factories import dra_pod, gpu_pod, resource_claim, resource_slice
from tests.kube.test_reconcile import GRACE, _exhaust, iso, sync
from tests.support.dra import EXTENDED_RESOURCE_CLAIM
from tests.support.kube_apiserver import KubeApiServer
from tests.timekeeper.conftest import START
from timekeeper.billing.repository import BillingRepository
from timekeeper.clock import ManualClock
from timekeeper.kube import KubeClient
from timekeeper.reconcile.service import Reconciler
from timekeeper.settings import Settings
from timekeeper.usage.models import LedgerEntry, PodCoverage

pytestmark = pytest.mark.asyncio(loop_scope="session")

H100 = {
    "name": "gpu-0",
    "attributes": {"type": "gpu", "uuid": "GPU-h100", "productName": "NVIDIA H100 80GB HBM3"},
}
A100 = {
    "name": "gpu-1",
    "attributes": {"type": "gpu", "uuid": "GPU-a100", "productName": "NVIDIA A100-SXM4-80GB"},
}
# As NVIDIA's DRA driver publishes a MIG device: its profile and its parent GPU (whose model it has).
MIG_1G: dict[str, Any] = {
    "name": "gpu-1-mig-1g10gb-0",
    "attributes": {"type": "mig", "uuid": "MIG-1", "profile": "1g.10gb", "parentUUID": "GPU-a100"},
}


@pytest.fixture
def sessionmaker(connection: AsyncConnection) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(
        bind=connection, expire_on_commit=False, join_transaction_mode="create_savepoint"
    )


@pytest.fixture
async def reconciler(
    kube: KubeClient, sessionmaker: async_sessionmaker[AsyncSession], settings: Settings, clock: ManualClock
) -> AsyncIterator[Reconciler]:
    settings = settings.model_copy(update={"silent_grace_seconds": GRACE.total_seconds()})
    yield Reconciler(kube, sessionmaker, settings, clock)


async def ledger_total(sessionmaker, namespace: str = "team-a") -> Decimal:
    async with sessionmaker() as session:
        total = await session.scalar(
            sa.select(sa.func.coalesce(sa.func.sum(LedgerEntry.gpu_minutes), 0)).where(
                LedgerEntry.namespace == namespace
            )
        )
    return Decimal(total)


async def test_a_claim_shared_by_two_pods_is_charged_once_and_the_pods_not_at_all(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, clock: ManualClock
):
    resource_slice(apiserver, "gpu-node-1", [H100])
    first = dra_pod(apiserver, "team-a", "first", "shared", started_at=iso(START - timedelta(minutes=65)))
    second = dra_pod(apiserver, "team-a", "second", "shared", started_at=iso(START - timedelta(minutes=35)))
    claim = resource_claim(apiserver, "team-a", "shared", ["gpu-0"], reserved_for=[first, second])
    await sync(reconciler)

    result = await reconciler.run_pass()

    # One GPU from the first pod's start to the grace: 60 minutes, however many pods share it.
    assert result.claims_charged == {claim["metadata"]["uid"]: Decimal("60.000000000")}
    assert result.charged == {}
    clock.advance(timedelta(minutes=10))
    result = await reconciler.run_pass()
    assert (result.claims_charged, result.charged) == (
        {claim["metadata"]["uid"]: Decimal("10.000000000")},
        {},
    )
    assert await ledger_total(sessionmaker) == Decimal(70)


async def test_a_claims_consumers_count_as_the_union_of_their_running_time(
    apiserver: KubeApiServer, reconciler: Reconciler
):
    resource_slice(apiserver, "gpu-node-1", [H100])
    early = dra_pod(
        apiserver,
        "team-a",
        "early",
        "named",
        started_at=iso(START - timedelta(minutes=120)),
        finished_at=iso(START - timedelta(minutes=90)),
        phase="Succeeded",
    )
    late = dra_pod(apiserver, "team-a", "late", "named", started_at=iso(START - timedelta(minutes=60)))
    # The scheduler dropped the ended pod from reservedFor; the pod still names the claim.
    claim = resource_claim(apiserver, "team-a", "named", ["gpu-0"], reserved_for=[late])
    await sync(reconciler)

    result = await reconciler.run_pass()

    # 30 minutes of the first pod, then 55 of the second: not the 60-minute gap between them.
    assert result.claims_charged == {claim["metadata"]["uid"]: Decimal("85.000000000")}
    assert early["metadata"]["uid"] in result.closed


async def test_a_mig_claim_is_charged_its_profiles_fraction_at_its_parent_gpus_weight(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    async with sessionmaker() as session, session.begin():
        await BillingRepository(session).set_weight(
            "NVIDIA-A100-SXM4-80GB", Decimal(2), START - timedelta(days=1), "admin"
        )
    resource_slice(apiserver, "gpu-node-1", [A100, MIG_1G])
    pod = dra_pod(apiserver, "team-a", "mig", "slice", started_at=iso(START - timedelta(minutes=75)))
    claim = resource_claim(
        apiserver,
        "team-a",
        "slice",
        ["gpu-1-mig-1g10gb-0"],
        reserved_for=[pod],
        device_class="mig.nvidia.com",
    )
    await sync(reconciler)

    result = await reconciler.run_pass()

    # 70 minutes x 1/7 of the GPU (one of an A100's seven slices) x the A100's weight 2.
    assert result.claims_charged == {claim["metadata"]["uid"]: Decimal("20.000000000")}
    async with sessionmaker() as session:
        model = await session.scalar(
            sa.select(PodCoverage.gpu_model).where(PodCoverage.pod_uid == claim["metadata"]["uid"])
        )
    assert model == "NVIDIA-A100-SXM4-80GB"


async def test_an_extended_resource_backed_pod_is_charged_once_by_its_limit(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    resource_slice(apiserver, "gpu-node-1", [H100])
    pod = gpu_pod(apiserver, "team-a", "plain", share="1", started_at=iso(START - timedelta(minutes=65)))
    # The scheduler's claim for the pod's nvidia.com/gpu served by a DeviceClass's extendedResourceName,
    # and the pod's status naming it (written by the scheduler alone).
    resource_claim(
        apiserver,
        "team-a",
        "plain-extended-resources-xyz",
        ["gpu-0"],
        reserved_for=[pod],
        annotations={EXTENDED_RESOURCE_CLAIM: "true"},
    )
    pod["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": "plain-extended-resources-xyz",
        "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "r0"}],
    }
    apiserver.put(pod)
    await sync(reconciler)

    result = await reconciler.run_pass()

    assert (result.charged, result.claims_charged) == ({pod["metadata"]["uid"]: Decimal("60.000000000")}, {})
    assert await ledger_total(sessionmaker) == Decimal(60)


async def test_a_claim_its_tenant_annotated_as_an_extended_resources_is_charged(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    """Issue 37: the annotation is the tenant's to write (on its claim, or its template's spec.metadata);
    no pod's status names the claim, so it is the claim's to charge."""
    resource_slice(apiserver, "gpu-node-1", [H100])
    pod = dra_pod(apiserver, "team-a", "free", "free-gpu", started_at=iso(START - timedelta(minutes=65)))
    claim = resource_claim(
        apiserver,
        "team-a",
        "free-gpu",
        ["gpu-0"],
        reserved_for=[pod],
        annotations={EXTENDED_RESOURCE_CLAIM: "true"},
    )
    await sync(reconciler)

    result = await reconciler.run_pass()

    assert result.claims_charged == {claim["metadata"]["uid"]: Decimal("60.000000000")}
    assert await ledger_total(sessionmaker) == Decimal(60)


async def test_a_claim_gone_with_its_ended_pod_is_charged_to_the_end_and_closed_once(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, clock: ManualClock
):
    resource_slice(apiserver, "gpu-node-1", [H100, A100])
    started = START - timedelta(minutes=65)
    pod = dra_pod(apiserver, "team-a", "job", "job-gpu", started_at=iso(started))
    claim = resource_claim(apiserver, "team-a", "job-gpu", ["gpu-0", "gpu-1"], reserved_for=[pod])
    await sync(reconciler)
    await reconciler.run_pass()  # two GPUs for 60 minutes
    clock.advance(timedelta(minutes=20))
    dra_pod(
        apiserver,
        "team-a",
        "job",
        "job-gpu",
        started_at=iso(started),
        finished_at=iso(START + timedelta(minutes=10)),
        phase="Succeeded",
    )
    apiserver.remove("resource.k8s.io/v1", "ResourceClaim", "team-a", "job-gpu")
    await sync(reconciler)

    result = await reconciler.run_pass()

    # Two models, two rows: each GPU up to the pod's end (the last 15 minutes), at weight 1.
    uid = claim["metadata"]["uid"]
    assert result.claims_charged == {uid: Decimal("15.000000000"), f"{uid}-1": Decimal("15.000000000")}
    async with sessionmaker() as session:
        rows = (
            await session.execute(
                sa.select(PodCoverage.final, PodCoverage.closed_at).where(
                    PodCoverage.pod_uid.in_([uid, f"{uid}-1"])
                )
            )
        ).all()
    assert rows == [(True, START + timedelta(minutes=10))] * 2
    clock.advance(timedelta(minutes=20))
    assert (await reconciler.run_pass()).claims_charged == {}
    assert reconciler.claims.claims() == {}
    assert await ledger_total(sessionmaker) == Decimal(150)


async def test_without_resource_k8s_io_pods_are_charged_as_before(
    apiserver: KubeApiServer, reconciler: Reconciler
):
    apiserver.serves_dra = False
    pod = gpu_pod(apiserver, "team-a", "old", share="0.5", started_at=iso(START - timedelta(minutes=65)))
    await sync(reconciler)

    result = await reconciler.run_pass()

    assert (result.charged, result.claims_charged) == ({pod["metadata"]["uid"]: Decimal("30.000000000")}, {})


async def test_a_pod_using_a_gpu_claim_is_a_gpu_pod_and_one_using_a_nic_claim_is_not(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    resource_slice(apiserver, "gpu-node-1", [H100])
    resource_slice(apiserver, "gpu-node-1", [{"name": "eth-0", "attributes": {}}], driver="nic.example.com")
    started = iso(START - timedelta(minutes=30))
    gpu = dra_pod(apiserver, "team-a", "dra-gpu", "gpu", started_at=started)
    nic = dra_pod(apiserver, "team-a", "dra-nic", "nic", started_at=started)
    resource_claim(apiserver, "team-a", "gpu", ["gpu-0"], reserved_for=[gpu])
    resource_claim(
        apiserver,
        "team-a",
        "nic",
        ["eth-0"],
        reserved_for=[nic],
        device_class="nic.example.com",
        driver="nic.example.com",
    )
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a", running_pod_action="evict")

    result = await reconciler.run_pass()

    assert sorted(result.evicted) == [("team-a", "dra-gpu"), ("team-a", "spender")]
    assert reconciler.pod_metrics.counts is not None
    assert reconciler.pod_metrics.counts["team-a"][0] == 2  # running GPU pods: not the NIC's


async def until(condition: Callable[[], bool], what: str) -> None:
    """Waits (at most 10 s) for what a watch task does meanwhile."""
    async with asyncio.timeout(10):
        while not condition():  # noqa: ASYNC110 (the watch tasks signal nothing a test could await)
            await asyncio.sleep(0.02)


async def test_a_claim_made_used_and_deleted_between_two_passes_is_charged_from_the_watch(
    apiserver: KubeApiServer, reconciler: Reconciler
):
    await reconciler.start_leading()
    try:
        await reconciler.wait_synced()
        await reconciler.run_pass()  # nothing yet
        resource_slice(apiserver, "gpu-node-1", [H100])
        started = START - timedelta(minutes=40)
        pod = dra_pod(apiserver, "team-a", "brief", "brief-gpu", started_at=iso(started))
        claim = resource_claim(apiserver, "team-a", "brief-gpu", ["gpu-0"], reserved_for=[pod])
        uid = claim["metadata"]["uid"]
        await until(lambda: reconciler.claims.seen(uid), "the watch to see the claim")
        # The pod ends; the controller deallocates its claim and deletes it, all before the next pass.
        dra_pod(
            apiserver,
            "team-a",
            "brief",
            "brief-gpu",
            started_at=iso(started),
            finished_at=iso(START - timedelta(minutes=10)),
            phase="Succeeded",
        )
        resource_claim(apiserver, "team-a", "brief-gpu", [], reserved_for=[])
        apiserver.remove("resource.k8s.io/v1", "ResourceClaim", "team-a", "brief-gpu")
        await until(
            lambda: any(p.ended_at for p in reconciler.registry.pods()), "the pod watch to see the pod end"
        )

        result = await reconciler.run_pass()
    finally:
        await reconciler.stop_leading()

    assert result.claims_charged == {uid: Decimal("30.000000000")}  # its run, to the pod's end
    assert reconciler.claims.claims() == {}
