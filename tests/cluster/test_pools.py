"""Pools chosen by a namespace label selector, on a real API server: the reconcile pass lists the
namespaces' labels as deployment/'s gpu-timekeeper ServiceAccount (so the RBAC we ship must allow it), and
a namespace joins or leaves a selector's pool as `kubectl label` changes it, its state following at once.
The pass runs in-process on the timekeeper suite's database, inside a transaction rolled back after."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from kubernetes import client
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from tests.cluster.harness import Kubectl, service_account_kubeconfig
from tests.support.control_plane import ControlPlane
from tests.support.postgres import url_string
from tests.support.timekeeper import report_body
from tests.timekeeper.conftest import clock, connection, database_url  # noqa: F401 (fixtures)
from timekeeper.auth.base import Principal
from timekeeper.budgets.pools.schemas import PoolIn
from timekeeper.budgets.pools.service import PoolService
from timekeeper.clock import ManualClock
from timekeeper.kube import KubeClient
from timekeeper.kube.client import KubeConfig
from timekeeper.reconcile.service import Reconciler
from timekeeper.settings import Settings
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import IngestService

pytestmark = [
    # The client's connections belong to the loop of the fixture that built it (the session's).
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.usefixtures("install"),  # deployment/'s ServiceAccounts and RBAC
]

ADMIN = Principal(name="admin")


@pytest.fixture
def teams(kubectl: Kubectl) -> Iterator[tuple[str, str, str, str]]:
    """Two fresh namespaces labelled with two organisations of this test's own: (a, b, vision, nlp)."""
    tag = uuid.uuid4().hex[:8]
    a, b, vision, nlp = f"pool-a-{tag}", f"pool-b-{tag}", f"vision-{tag}", f"nlp-{tag}"
    for name, org in ((a, vision), (b, nlp)):
        kubectl.run("create", "namespace", name)
        kubectl.run("label", "namespace", name, f"org={org}")
    yield a, b, vision, nlp
    kubectl.run("delete", "namespace", a, b, "--wait=false")


@pytest.fixture
async def reconciler(
    control_plane: ControlPlane,
    core: client.CoreV1Api,
    tmp_path: Path,
    connection: AsyncConnection,  # noqa: F811 (the imported fixture)
    database_url: URL,  # noqa: F811
    clock: ManualClock,  # noqa: F811
) -> AsyncIterator[Reconciler]:
    kubeconfig = service_account_kubeconfig(control_plane, core, "gpu-timekeeper", tmp_path)
    kube = await KubeClient.from_config(KubeConfig(in_cluster=False, kubeconfig=kubeconfig))
    sessionmaker = async_sessionmaker(
        bind=connection, expire_on_commit=False, join_transaction_mode="create_savepoint"
    )
    settings = Settings(database_url=url_string(database_url), scheduler_enabled=False)
    yield Reconciler(kube, sessionmaker, settings, clock)
    await kube.close()


async def pass_(reconciler: Reconciler) -> list[str]:
    reconciler.registry.apply(await reconciler.kube.list_pods())
    return (await reconciler.run_pass()).pool_moves


async def state(sessionmaker: async_sessionmaker[AsyncSession], name: str) -> str | None:
    async with sessionmaker() as session:
        result = await session.execute(
            sa.text("SELECT state FROM namespace_status WHERE namespace = :ns"), {"ns": name}
        )
        return result.scalar_one_or_none()


async def test_a_namespace_joins_and_leaves_a_selectors_pool_as_its_labels_change(
    kubectl: Kubectl,
    reconciler: Reconciler,
    teams: tuple[str, str, str, str],
    clock: ManualClock,  # noqa: F811 (the imported fixture)
) -> None:
    a, b, vision, nlp = teams
    sessionmaker, settings = reconciler.sessionmaker, reconciler.settings
    async with sessionmaker() as session, session.begin():
        pool = PoolIn.model_validate(
            {"budget_gpu_minutes": 10, "namespace_selector": {"matchLabels": {"org": vision}}}
        )
        await PoolService(session, settings, clock).put("vision", pool, ADMIN)
        body = report_body(
            namespace=a, pod_uid=f"uid-{a}", start=clock.now() - timedelta(minutes=10), minutes=10
        )
        # In Kubernetes auth mode the charge is at the share read from the pod (here given: 1 GPU).
        await IngestService(session, settings).charge_one(
            ReportIn.model_validate(body), clock.now(), admitted_share=Decimal(1)
        )

    assert await pass_(reconciler) == [a]
    assert await state(sessionmaker, a) == "exhausted"  # the pool's 10 are spent
    assert await pass_(reconciler) == []  # nothing changed since

    kubectl.run("label", "namespace", a, f"org={nlp}", "--overwrite")
    kubectl.run("label", "namespace", b, f"org={vision}", "--overwrite")

    assert await pass_(reconciler) == [a, b]
    assert (await state(sessionmaker, a), await state(sessionmaker, b)) == ("unlimited", "in_budget")
    async with sessionmaker() as session:
        members = (await PoolService(session, settings, clock).pool("vision")).members
    assert [(m.namespace, m.listed) for m in members] == [(b, False)]
