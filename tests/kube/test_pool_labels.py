"""Pools chosen by a namespace label selector: the reconcile pass lists the namespaces' labels (with the
timekeeper's own RBAC, against the stand-in API server) and a namespace joins or leaves a selector's pool
as its labels change, its state following at once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from tests.support.kube_apiserver import KubeApiServer
from tests.support.timekeeper import report_body
from timekeeper.auth.base import Principal
from timekeeper.clock import ManualClock
from timekeeper.kube import KubeClient
from timekeeper.pools.schemas import PoolIn
from timekeeper.pools.service import PoolService
from timekeeper.reconcile.service import Reconciler
from timekeeper.settings import Settings
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import IngestService

pytestmark = pytest.mark.asyncio(loop_scope="session")

ADMIN = Principal(name="admin")


def namespace(server: KubeApiServer, name: str, **labels: str) -> None:
    server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})


@pytest.fixture
def sessionmaker(connection: AsyncConnection) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(
        bind=connection, expire_on_commit=False, join_transaction_mode="create_savepoint"
    )


@pytest.fixture
async def reconciler(
    kube: KubeClient, sessionmaker: async_sessionmaker[AsyncSession], settings: Settings, clock: ManualClock
) -> AsyncIterator[Reconciler]:
    yield Reconciler(kube, sessionmaker, settings, clock)


async def pass_(reconciler: Reconciler) -> list[str]:
    reconciler.registry.apply(await reconciler.kube.list_pods())
    return (await reconciler.run_pass()).pool_moves


async def state(connection: AsyncConnection, name: str) -> str | None:
    result = await connection.execute(
        sa.text("SELECT state FROM namespace_status WHERE namespace = :ns"), {"ns": name}
    )
    return result.scalar_one_or_none()


async def test_a_namespace_joins_and_leaves_a_selectors_pool_as_its_labels_change(
    apiserver: KubeApiServer,
    reconciler: Reconciler,
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    clock: ManualClock,
    connection: AsyncConnection,
) -> None:
    namespace(apiserver, "team-a", org="vision")
    namespace(apiserver, "team-b", org="nlp")
    async with sessionmaker() as session, session.begin():
        pool = PoolIn.model_validate(
            {"budget_gpu_minutes": 10, "namespace_selector": {"matchLabels": {"org": "vision"}}}
        )
        await PoolService(session, settings, clock).put("vision", pool, ADMIN)
        body = report_body(
            namespace="team-a", pod_uid="uid-a", start=clock.now() - timedelta(minutes=10), minutes=10
        )
        # In Kubernetes auth mode the charge is at the share read from the pod (here given: 1 GPU).
        await IngestService(session, settings).charge_one(
            ReportIn.model_validate(body), clock.now(), admitted_share=Decimal(1)
        )

    assert await pass_(reconciler) == ["team-a"]
    assert await state(connection, "team-a") == "exhausted"  # the pool's 10 are spent
    assert await pass_(reconciler) == []  # nothing changed since

    namespace(apiserver, "team-a", org="nlp")
    namespace(apiserver, "team-b", org="vision")

    assert await pass_(reconciler) == ["team-a", "team-b"]
    assert (await state(connection, "team-a"), await state(connection, "team-b")) == (
        "unlimited",
        "in_budget",
    )
    async with sessionmaker() as session:
        members = (await PoolService(session, settings, clock).pool("vision")).members
    assert [(m.namespace, m.listed) for m in members] == [("team-b", False)]
