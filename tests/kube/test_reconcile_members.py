"""A hub reconciling its members (docs/fleet.md): `build_reconcilers` gives one Reconciler per cluster,
each through its own stand-in API server (the local one, and member `b` through its kubeconfig, as its
ServiceAccount with the RBAC we ship), on the real database. Both clusters hold a `team-a`: each pass
reads and writes the store under its cluster's keys and acts in its own cluster only. The same on two
real API servers: tests/cluster/test_fleet_reconcile.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from tests.kube.factories import gpu_pod
from tests.support.kube_apiserver import KubeApiServer
from tests.support.kube_rbac import TIMEKEEPER_NAMESPACE, TIMEKEEPER_SERVICE_ACCOUNT, install_cluster_roles
from tests.support.timekeeper import report_body
from tests.timekeeper.conftest import START
from timekeeper.auth.base import Principal
from timekeeper.budgets.pools.models import MEMBERSHIP_SQL
from timekeeper.budgets.schemas import BudgetIn
from timekeeper.budgets.service import BudgetService
from timekeeper.clock import ManualClock
from timekeeper.errors import TimekeeperError
from timekeeper.kube import KubeClient
from timekeeper.periodic.jobs import reconcile_job, run_job
from timekeeper.reconcile.service import Reconciler, Reconcilers, build_reconcilers
from timekeeper.settings import Member, Settings
from timekeeper.usage.router import keyed
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import IngestService

pytestmark = pytest.mark.asyncio(loop_scope="session")

GRACE = timedelta(minutes=5)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def member(apiserver: KubeApiServer) -> Iterator[KubeApiServer]:
    apiserver.with_identity()  # the hub's own cluster
    server = KubeApiServer().start().with_identity()
    install_cluster_roles(server)
    yield server
    server.stop()


@pytest.fixture
def sessionmaker(connection: AsyncConnection) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(
        bind=connection, expire_on_commit=False, join_transaction_mode="create_savepoint"
    )


@pytest.fixture
async def reconcilers(
    settings: Settings,
    member: KubeApiServer,
    tmp_path: Path,
    sessionmaker: async_sessionmaker[AsyncSession],
    clock: ManualClock,
) -> AsyncIterator[Reconcilers]:
    token = member.add_service_account_token(TIMEKEEPER_NAMESPACE, TIMEKEEPER_SERVICE_ACCOUNT)
    b = Member(kubeconfig=member.write_kubeconfig(tmp_path / "kubeconfig-b", token))
    update = {"members": {"b": b}, "silent_grace_seconds": GRACE.total_seconds()}
    built = await build_reconcilers(settings.model_copy(update=update), sessionmaker, clock)
    yield built
    for reconciler in built.clusters:
        await reconciler.aclose()


def clusters(reconcilers: Reconcilers) -> tuple[Reconciler, Reconciler]:
    local, b = reconcilers.clusters
    assert (local.cluster, b.cluster) == (None, "b")
    return local, b


async def passes(reconcilers: Reconcilers) -> None:
    """What the watches do (the registries from one list each), then one pass per cluster."""
    for reconciler in reconcilers.clusters:
        reconciler.registry.apply(await reconciler.kube.list_pods())
    for reconciler in reconcilers.clusters:
        await reconciler.run_pass()


async def charged(sessionmaker: async_sessionmaker[AsyncSession]) -> dict[str, Decimal]:
    async with sessionmaker() as session:
        result = await session.execute(
            sa.text("SELECT namespace, sum(gpu_minutes) FROM usage_ledger GROUP BY namespace")
        )
        return dict(result.tuples().all())


async def set_budget(reconciler: Reconciler, namespace: str, **fields: object) -> None:
    async with reconciler.sessionmaker() as session, session.begin():
        service = BudgetService(session, reconciler.settings, reconciler.clock)
        await service.put(namespace, BudgetIn.model_validate(fields), Principal(name="admin"))


async def test_a_members_silent_pod_is_charged_under_its_key_once_and_never_to_the_hubs_namesake(
    apiserver: KubeApiServer, member: KubeApiServer, reconcilers: Reconcilers, sessionmaker, clock
) -> None:
    _, b = clusters(reconcilers)
    gpu_pod(apiserver, "team-a", "other", share="1", started_at=None, phase="Pending")
    silent = gpu_pod(member, "team-a", "silent", share="0.5", started_at=iso(START - timedelta(minutes=65)))

    await passes(reconcilers)
    await passes(reconcilers)  # nothing more: charged once

    # 65 minutes running, the last 5 left for the sidecar: 60 minutes x 0.5 GPU, under b's key only.
    assert await charged(sessionmaker) == {"b/team-a": Decimal(30)}
    # Its sidecar's late report of time the pass charged is covered: the same pod, under the keys the
    # report route gives a report of b's (`keyed`).
    meta = silent["metadata"]
    body = report_body(
        namespace="team-a",
        pod=meta["name"],
        pod_uid=meta["uid"],
        start=START - timedelta(minutes=20),
        minutes=10,
    )
    async with sessionmaker() as session, session.begin():
        late = keyed(b.cluster, ReportIn.model_validate(body))
        outcome = await IngestService(session, b.settings).charge_one(late, clock.now())
    assert outcome.gpu_minutes == 0
    assert await charged(sessionmaker) == {"b/team-a": Decimal(30)}
    async with sessionmaker() as session:
        keys = set((await session.execute(sa.text("SELECT pod_uid FROM pod_coverage"))).scalars())
    assert keys == {f"b/{meta['uid']}"}


async def test_an_exhausted_member_namespace_is_downgraded_in_its_own_cluster_only(
    apiserver: KubeApiServer, member: KubeApiServer, reconcilers: Reconcilers
) -> None:
    local, b = clusters(reconcilers)
    await set_budget(b, "b/team-a", budget_gpu_minutes=0, running_pod_action="evict")
    await set_budget(local, "team-a", budget_gpu_minutes=1000, running_pod_action="evict")
    for server in (apiserver, member):
        gpu_pod(server, "team-a", "web", started_at=iso(START - timedelta(minutes=1)))
    for reconciler in reconcilers.clusters:
        reconciler.registry.apply(await reconciler.kube.list_pods())

    here = await local.run_pass()
    there = await b.run_pass()

    assert here.evicted == []
    assert there.evicted == [("team-a", "web")]
    assert member.get("v1", "Pod", "team-a", "web")["metadata"].get("deletionTimestamp")
    assert not apiserver.get("v1", "Pod", "team-a", "web")["metadata"].get("deletionTimestamp")
    downgraded = [
        e["reason"] for e in member.list("v1", "Event", "team-a") if e["involvedObject"]["kind"] == "Pod"
    ]
    assert downgraded == ["GPUBudgetDowngrade"]


async def test_a_members_namespace_labels_are_kept_under_its_keys(
    apiserver: KubeApiServer, member: KubeApiServer, reconcilers: Reconcilers, sessionmaker
) -> None:
    for server, org in ((apiserver, "hub"), (member, "member")):
        server.put(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {"org": org}}}
        )

    await passes(reconcilers)
    member.remove("v1", "Namespace", None, "team-a")
    local, _ = clusters(reconcilers)
    await local.run_pass()  # the local cluster's pass forgets none of b's

    async with sessionmaker() as session:
        rows = await session.execute(sa.text("SELECT namespace, labels FROM namespace_labels"))
        labels = {namespace: value for namespace, value in rows.tuples()}
    assert labels["team-a"] == {"org": "hub"} and labels["b/team-a"] == {"org": "member"}
    # A selector matches the hub's own namespaces only: b's admin writes b's labels.
    async with sessionmaker() as session, session.begin():
        await session.execute(
            sa.text(
                "INSERT INTO budget_pools (name, budget_gpu_minutes, period, warn_at_fraction, "
                "namespace_selector, updated_by) VALUES ('all', 10, 'monthly', 0.8, '{}', 'admin')"
            )
        )
        members = (await session.execute(sa.text(f"SELECT namespace FROM {MEMBERSHIP_SQL} pm"))).scalars()
        assert set(members) == {"kube-system", "team-a"}  # the hub's own namespaces, none of b's
    await clusters(reconcilers)[1].run_pass()
    async with sessionmaker() as session:
        keys = set((await session.execute(sa.text("SELECT namespace FROM namespace_labels"))).scalars())
    assert "b/team-a" not in keys and "team-a" in keys


async def test_each_clusters_pods_are_counted_under_its_keys_in_one_collector(
    apiserver: KubeApiServer, member: KubeApiServer, reconcilers: Reconcilers
) -> None:
    local, b = clusters(reconcilers)
    gpu_pod(apiserver, "team-a", "one", started_at=iso(START))
    for name in ("two", "three"):
        gpu_pod(member, "team-a", name, started_at=iso(START))

    await passes(reconcilers)
    counted = dict(reconcilers.pod_metrics.counts or {})
    await b.stop_leading()

    assert counted == {"team-a": (1, 0), "b/team-a": (2, 0)}
    assert reconcilers.pod_metrics.counts == {"team-a": (1, 0)}
    await local.stop_leading()
    assert reconcilers.pod_metrics.counts is None


async def test_a_member_whose_api_server_is_away_fails_its_own_job_and_the_local_one_runs(
    apiserver: KubeApiServer, member: KubeApiServer, reconcilers: Reconcilers, sessionmaker, clock
) -> None:
    """The passes are one job per cluster: b's fails (before charging anything from its watch's last
    list), the local cluster's charges and records its window."""
    local, b = clusters(reconcilers)
    gpu_pod(member, "team-a", "gone", started_at=iso(START - timedelta(minutes=65)))
    ours = gpu_pod(apiserver, "team-a", "ours", started_at=iso(START - timedelta(minutes=65)))
    local.registry.apply(await local.kube.list_pods())
    # b's watch listed its pods (through a client of its own: b's reconciler has not connected yet, so
    # none of its connections outlives the server), then b's API server went away.
    token = member.add_service_account_token(TIMEKEEPER_NAMESPACE, TIMEKEEPER_SERVICE_ACCOUNT)
    watch = KubeClient(member.asyncio_configuration(token), request_timeout_seconds=5)
    b.registry.apply(await watch.list_pods())
    await watch.close()
    member.stop()

    with pytest.raises(TimekeeperError, match="member cluster b cannot tell its identity"):
        await run_job(reconcile_job(b, b.cluster), sessionmaker, b.settings, clock, "replica")
    ran = await run_job(reconcile_job(local, local.cluster), sessionmaker, local.settings, clock, "replica")

    assert ran.detail is not None and ran.detail["charged"] == {ours["metadata"]["uid"]: "60.000000000"}
    assert await charged(sessionmaker) == {"team-a": Decimal(60)}
    async with sessionmaker() as session:
        jobs = set(
            (await session.execute(sa.text("SELECT job FROM job_runs WHERE job LIKE 'reconcile%'"))).scalars()
        )
    assert jobs == {"reconcile"}  # b's window is not claimed: its next run tries it again


async def test_a_member_pod_with_a_forged_uid_of_a_hub_pod_is_charged_under_its_own_pod_key(
    apiserver: KubeApiServer, member: KubeApiServer, reconcilers: Reconcilers, sessionmaker
) -> None:
    """b's admin makes b's API server answer the uid of the hub's pod: both are charged, each once,
    under its own cluster's keys; neither covers, closes or blocks the other."""
    ours = gpu_pod(apiserver, "team-a", "ours", started_at=iso(START - timedelta(minutes=65)))
    gpu_pod(member, "team-a", "forged", share="0.5", started_at=iso(START - timedelta(minutes=65)))
    uid = ours["metadata"]["uid"]
    member.forge_uid("team-a", "forged", uid)

    await passes(reconcilers)
    await passes(reconcilers)

    assert await charged(sessionmaker) == {"team-a": Decimal(60), "b/team-a": Decimal(30)}
    async with sessionmaker() as session:
        keys = set((await session.execute(sa.text("SELECT pod_uid FROM pod_coverage"))).scalars())
    assert keys == {uid, f"b/{uid}"}


async def test_the_hubs_own_cluster_configured_as_a_member_is_reconciled_once(
    apiserver: KubeApiServer, settings: Settings, tmp_path: Path, sessionmaker, clock
) -> None:
    """One API server under two names (the hub's own, and member `again`): the member's pass is refused
    as its requests are (ClusterIdentities), so the pod is charged once, under the hub's key only."""
    apiserver.with_identity()
    token = apiserver.add_service_account_token(TIMEKEEPER_NAMESPACE, TIMEKEEPER_SERVICE_ACCOUNT)
    again = Member(kubeconfig=apiserver.write_kubeconfig(tmp_path / "kubeconfig-again", token))
    update = {"members": {"again": again}, "silent_grace_seconds": GRACE.total_seconds()}
    built = await build_reconcilers(settings.model_copy(update=update), sessionmaker, clock)
    try:
        local, twice = built.clusters
        gpu_pod(apiserver, "team-a", "ours", started_at=iso(START - timedelta(minutes=65)))
        for reconciler in built.clusters:
            reconciler.registry.apply(await reconciler.kube.list_pods())

        with pytest.raises(TimekeeperError) as refused:
            await twice.run_pass()
        await local.run_pass()
    finally:
        for reconciler in built.clusters:
            await reconciler.aclose()

    assert refused.value.status_code == 503 and "same cluster as the hub" in refused.value.message
    assert await charged(sessionmaker) == {"team-a": Decimal(60)}
