"""The Workload watch of the `kueue` action (issue 37): a Workload that a tenant raises, or makes anew, in a
namespace lowered now is lowered as the change arrives, not on the next pass; what the pass would leave
alone, the watch leaves alone too. The watch itself is proven on the real API server
(tests/cluster/test_tenant_enforcement.py); here the decision and the write, with a recording client."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from tests.timekeeper.test_kueue_rules import workload
from timekeeper.auth.base import Principal
from timekeeper.budgets.schemas import BudgetIn
from timekeeper.budgets.service import BudgetService
from timekeeper.clock import ManualClock
from timekeeper.metrics import DowngradeMetrics
from timekeeper.reconcile.kueue import LOWERED_LABEL, KueuePriorities
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

REDUCED = 10


class RecordingKube:
    """The calls the watch makes: the reduced class's value, and the patches."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self.reads = 0

    async def read_cluster_object(self, group: str, version: str, plural: str, name: str) -> dict[str, Any]:
        self.reads += 1
        return {"value": REDUCED}

    async def merge_patch_object(
        self, group: str, version: str, plural: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        self.patches.append((namespace, name, patch))
        return {}

    async def post_event(self, *args: Any) -> None:
        return None


@pytest.fixture
def sessionmaker(connection: AsyncConnection) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(
        bind=connection, expire_on_commit=False, join_transaction_mode="create_savepoint"
    )


@pytest.fixture
async def priorities(
    sessionmaker: async_sessionmaker[AsyncSession], settings: Settings, clock: ManualClock
) -> tuple[KueuePriorities, RecordingKube]:
    """team-a spent and says `kueue`; team-b spent and says `evict`; team-c in budget and says `kueue`."""
    async with sessionmaker() as session, session.begin():
        service = BudgetService(session, settings, clock)
        for namespace, budget, action in (
            ("team-a", 0, "kueue"),
            ("team-b", 0, "evict"),
            ("team-c", 60, "kueue"),
        ):
            await service.put(
                namespace,
                BudgetIn(budget_gpu_minutes=budget, running_pod_action=action),
                Principal(name="admin"),
            )
    kube = RecordingKube()
    return KueuePriorities(kube, sessionmaker, settings, clock, DowngradeMetrics()), kube  # type: ignore[arg-type]


def raised(namespace: str = "team-a", **fields: Any) -> dict[str, Any]:
    found = workload(namespace=namespace, **fields)
    found["metadata"]["resourceVersion"] = "7"
    return found


async def test_a_raised_workload_of_a_lowered_namespace_is_lowered_at_once(
    priorities: tuple[KueuePriorities, RecordingKube],
) -> None:
    watch, kube = priorities

    await watch.on_change(raised())

    [(namespace, name, patch)] = kube.patches
    assert (namespace, name, patch["spec"], patch["metadata"]["labels"]) == (
        "team-a",
        "w",
        {"priority": REDUCED},
        {LOWERED_LABEL: "true"},
    )
    assert patch["metadata"]["resourceVersion"] == "7"  # conditional: a newer change is its own event
    counted = watch.metrics.kueue_lowered.labels(trigger="watch")._value.get()
    assert counted == 1


@pytest.mark.parametrize(
    "change",
    [
        raised("team-b"),  # spent, but its action is not kueue
        raised("team-c"),  # its action, but in budget
        raised("team-z"),  # no budget of its own: the default's action (none)
        raised(priority=REDUCED),  # already at the reduced value (our own patch's event)
        raised(resources={"cpu": "2"}),  # no GPU
        raised(finished=True),
        {"metadata": {"name": "w"}, "spec": {"priority": 5000}},  # no namespace
    ],
    ids=["other-action", "in-budget", "default", "at-reduced", "no-gpu", "finished", "no-namespace"],
)
async def test_what_the_pass_leaves_alone_the_watch_leaves_alone(
    priorities: tuple[KueuePriorities, RecordingKube], change: dict[str, Any]
) -> None:
    watch, kube = priorities

    await watch.on_change(change)

    assert kube.patches == []


async def test_the_reduced_value_is_read_once_then_kept(
    priorities: tuple[KueuePriorities, RecordingKube],
) -> None:
    watch, kube = priorities

    for _ in range(3):
        await watch.on_change(raised())

    assert kube.reads == 1
