"""The GPUBudget sync's passes on the real database, with the cluster replaced by a list of objects (the
real API server drives it in tests/cluster/test_gitops.py): what a pass writes, and what it does not."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection, async_sessionmaker

from tests.support.timekeeper import Api, ok
from tests.timekeeper.conftest import START
from timekeeper.clock import ManualClock
from timekeeper.gitops.objects import BUDGETS, DEFAULTS
from timekeeper.gitops.sync import GitOpsSync
from timekeeper.metrics import GitOpsMetrics
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Cluster:
    """The two lists the sync reads and the status writes it makes: the KubeClient calls it uses."""

    def __init__(self) -> None:
        self.objects: dict[str, list[dict[str, Any]]] = {BUDGETS: [], DEFAULTS: []}
        self.status_writes: list[dict[str, Any]] = []
        self.listed, self.written = asyncio.Event(), asyncio.Event()
        self.changes: dict[str, asyncio.Queue[tuple[str, str | None, str]]] = {
            BUDGETS: asyncio.Queue(),
            DEFAULTS: asyncio.Queue(),
        }

    def add(self, namespace: str, spec: dict[str, Any], name: str = "budget", generation: int = 1) -> None:
        self.objects[BUDGETS].append(
            {
                "apiVersion": "gpu-timekeeper.io/v1alpha1",
                "kind": "GPUBudget",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": f"uid-{namespace}-{name}",
                    "generation": generation,
                    "creationTimestamp": "2026-03-01T00:00:00Z",
                },
                "spec": spec,
            }
        )

    async def list_custom_objects(self, group: str, version: str, plural: str) -> list[dict[str, Any]]:
        self.listed.set()
        return copy.deepcopy(self.objects[plural])

    async def replace_custom_object_status(self, group: str, version: str, plural: str, obj: dict) -> None:
        self.status_writes.append(obj)
        self.written.set()
        for stored in self.objects[plural]:
            if stored["metadata"]["uid"] == obj["metadata"]["uid"]:
                stored["status"] = obj["status"]

    async def watch_custom_objects(
        self, group: str, version: str, plural: str
    ) -> AsyncIterator[tuple[str, str | None, str]]:
        while True:
            yield await self.changes[plural].get()

    async def close(self) -> None:
        pass


@pytest.fixture
async def sync(
    settings: Settings, clock: ManualClock, connection: AsyncConnection
) -> AsyncIterator[tuple[GitOpsSync, Cluster]]:
    cluster = Cluster()
    sessionmaker = async_sessionmaker(
        bind=connection, expire_on_commit=False, join_transaction_mode="create_savepoint"
    )
    quiet = settings.model_copy(update={"gitops_status_interval_seconds": 3600.0})
    yield GitOpsSync(cluster, sessionmaker, quiet, clock, GitOpsMetrics()), cluster  # type: ignore[arg-type]


async def test_a_pass_applies_a_spec_once_and_a_pass_with_nothing_new_writes_nothing(
    sync: tuple[GitOpsSync, Cluster], api: Api
) -> None:
    syncer, cluster = sync
    cluster.add("team-a", {"budgetGPUMinutes": 100, "period": "monthly", "warnAtFraction": 0.5})

    first = await syncer.run_pass()
    assert (first.applied, first.statuses) == (["GPUBudget team-a/budget"], 1)
    assert (await api.budget("team-a"))["budget_gpu_minutes"] == 100

    second = await syncer.run_pass()
    assert (second.applied, second.released, second.statuses) == ([], [], 0)
    audit = ok(await api.get("/audit", namespace="team-a"))
    assert [entry["actor"] for entry in audit] == ["gitops:GPUBudget team-a/budget"]


async def test_figures_alone_wait_for_the_status_interval_a_new_state_does_not(
    sync: tuple[GitOpsSync, Cluster], api: Api
) -> None:
    syncer, cluster = sync
    cluster.add("team-a", {"budgetGPUMinutes": 100, "warnAtFraction": 0.5})
    await syncer.run_pass()

    ok(await api.report(namespace="team-a", seq=1, start=START - timedelta(minutes=60), minutes=10))
    assert (await syncer.run_pass()).statuses == 0  # 10 used: only the figures moved
    assert cluster.objects[BUDGETS][0]["status"]["usedGPUMinutes"] == "0"

    ok(await api.report(namespace="team-a", seq=2, start=START - timedelta(minutes=50), minutes=50))
    assert (await syncer.run_pass()).statuses == 1  # 60 of 100: warning
    status = cluster.objects[BUDGETS][0]["status"]
    assert (status["state"], status["usedGPUMinutes"]) == ("warning", "60")


async def test_a_deleted_object_returns_its_namespace_to_the_default(
    sync: tuple[GitOpsSync, Cluster], api: Api
) -> None:
    syncer, cluster = sync
    cluster.add("team-a", {"budgetGPUMinutes": 100})
    await syncer.run_pass()
    assert (await api.put_budget("team-a", budget_gpu_minutes=5)).status_code == 409

    cluster.objects[BUDGETS].clear()
    result = await syncer.run_pass()
    assert result.released == ["team-a"]
    assert (await api.budget("team-a"))["source"] == "default"
    [deleted, _] = ok(await api.get("/audit", namespace="team-a"))
    assert (deleted["actor"], deleted["action"]) == (
        "gitops:GPUBudget team-a/budget (deleted)",
        "budget.delete",
    )
    ok(await api.put_budget("team-a", budget_gpu_minutes=5))


async def test_a_new_generation_is_applied_and_an_invalid_one_keeps_the_last_valid(
    sync: tuple[GitOpsSync, Cluster], api: Api
) -> None:
    syncer, cluster = sync
    cluster.add("team-a", {"budgetGPUMinutes": 100})
    await syncer.run_pass()
    cluster.objects[BUDGETS].clear()
    cluster.add("team-a", {"budgetGPUMinutes": 100, "warnAtFraction": 0.12345}, generation=2)

    invalid = await syncer.run_pass()
    assert invalid.applied == [] and "spec.warnAtFraction" in invalid.not_ready["GPUBudget team-a/budget"]
    assert (await api.budget("team-a"))["budget_gpu_minutes"] == 100
    ready = cluster.objects[BUDGETS][0]["status"]["conditions"][0]
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == ("False", "InvalidSpec", 2)

    cluster.objects[BUDGETS].clear()
    cluster.add("team-a", {"budgetGPUMinutes": 250}, generation=3)
    assert (await syncer.run_pass()).applied == ["GPUBudget team-a/budget"]
    assert (await api.budget("team-a"))["budget_gpu_minutes"] == 250


async def test_a_change_the_watch_reports_starts_a_pass_long_before_the_interval(
    sync: tuple[GitOpsSync, Cluster], api: Api
) -> None:
    syncer, cluster = sync
    syncer.settings = syncer.settings.model_copy(update={"gitops_interval_seconds": 3600.0})
    await syncer.start_leading()
    try:
        await cluster.listed.wait()  # its first pass runs at once, and finds nothing
        await asyncio.sleep(0.2)
        cluster.add("team-a", {"budgetGPUMinutes": 100})
        await cluster.changes[BUDGETS].put(("ADDED", "team-a", "budget"))
        async with asyncio.timeout(10):  # not the hour: the watch woke the loop
            await cluster.written.wait()
    finally:
        await syncer.stop_leading()
    assert (await api.budget("team-a"))["budget_gpu_minutes"] == 100


async def test_spec_models_are_applied_once_and_an_exhausted_model_is_a_new_status(
    sync: tuple[GitOpsSync, Cluster], api: Api
) -> None:
    syncer, cluster = sync
    cluster.add(
        "team-a",
        {"budgetGPUMinutes": 1000, "models": {"Tesla T4": {"budgetGPUMinutes": 5}}, "modelPolicy": "steer"},
    )
    await syncer.run_pass()
    status = await api.budget("team-a")
    assert (status["models"]["Tesla-T4"]["budget_gpu_minutes"], status["model_policy"]) == (5, "steer")
    assert (await syncer.run_pass()).applied == []  # the stored models are what the spec says

    gpus = [
        {"uuid": "GPU-0", "sm_util_pct": 50.0, "mem_used_bytes": 1, "mem_total_bytes": 2, "name": "Tesla T4"}
    ]
    ok(await api.report(namespace="team-a", seq=1, start=START - timedelta(minutes=60), minutes=6, gpus=gpus))

    assert (await syncer.run_pass()).statuses == 1  # the T4 exhausted: a new status at once
    assert cluster.objects[BUDGETS][0]["status"]["exhaustedModels"] == ["Tesla-T4"]
