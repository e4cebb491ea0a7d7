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
from timekeeper.budgets.repository import BudgetRepository
from timekeeper.clock import ManualClock
from timekeeper.gitops.objects import BUDGETS, DEFAULTS
from timekeeper.gitops.sync import FleetGitOpsSync, GitOpsSync
from timekeeper.kube import KubeUnavailableError
from timekeeper.metrics import GitOpsMetrics
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Cluster:
    """The two lists the sync reads and the status writes it makes: the KubeClient calls it uses."""

    def __init__(self) -> None:
        self.objects: dict[str, list[dict[str, Any]]] = {BUDGETS: [], DEFAULTS: []}
        self.status_writes: list[dict[str, Any]] = []
        self.away = False  # an API server that cannot be reached
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
        if self.away:
            raise KubeUnavailableError("connection refused")
        return copy.deepcopy(self.objects[plural])

    async def replace_custom_object_status(self, group: str, version: str, plural: str, obj: dict) -> None:
        self.status_writes.append(obj)
        self.written.set()
        for stored in self.objects[plural]:
            if stored["metadata"].get("uid") == obj["metadata"]["uid"]:
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


@pytest.fixture
def member(sync: tuple[GitOpsSync, Cluster]) -> tuple[GitOpsSync, Cluster]:
    """Member b's sync beside the hub's own (`sync`): the same database, b's API server stood in."""
    local, _ = sync
    cluster = Cluster()
    syncer = GitOpsSync(
        cluster,  # type: ignore[arg-type]
        local.sessionmaker,
        local.settings,
        local.clock,
        GitOpsMetrics(["", "b"]),
        cluster="b",
    )
    return syncer, cluster


async def own_budget(syncer: GitOpsSync, key: str) -> dict[str, Any] | None:
    async with syncer.sessionmaker() as session, session.begin():
        own = await BudgetRepository(session).own(key)
    return None if own is None else own.as_json()


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


async def test_a_members_gpubudget_sets_its_own_namespace_key_and_its_status_there(
    sync: tuple[GitOpsSync, Cluster], member: tuple[GitOpsSync, Cluster], api: Api
) -> None:
    """b's team-x is `b/team-x`: the hub's team-x keeps its REST budget, and each cluster's pass leaves the
    other's claims alone (neither releases what it did not list)."""
    local, hub = sync
    syncer, b = member
    ok(await api.put_budget("team-x", budget_gpu_minutes=500))
    b.add("team-x", {"budgetGPUMinutes": 1000})

    result = await syncer.run_pass()
    assert (result.applied, result.statuses) == (["GPUBudget b/team-x/budget"], 1)
    assert ((await own_budget(syncer, "b/team-x")) or {})["budget_gpu_minutes"] == "1000"
    assert (await api.budget("team-x"))["budget_gpu_minutes"] == 500
    status = b.objects[BUDGETS][0]["status"]
    assert (status["budgetGPUMinutes"], status["conditions"][0]["status"]) == ("1000", "True")
    assert hub.status_writes == []

    assert (await local.run_pass()).released == []  # the hub's pass does not release b's namespace
    assert (await syncer.run_pass()).applied == []
    ok(await api.put_budget("team-x", budget_gpu_minutes=600))  # the hub's team-x is still the REST API's
    audit = ok(await api.get("/audit", namespace="team-x"))
    assert all(not entry["actor"].startswith("gitops:") for entry in audit)


async def test_deleting_a_members_gpubudget_releases_its_key_alone(
    sync: tuple[GitOpsSync, Cluster], member: tuple[GitOpsSync, Cluster], api: Api
) -> None:
    local, hub = sync
    syncer, b = member
    hub.add("team-x", {"budgetGPUMinutes": 100})
    b.add("team-x", {"budgetGPUMinutes": 1000})
    await local.run_pass()
    assert (await syncer.run_pass()).released == []  # the hub's team-x is not b's to release
    assert (await api.put_budget("team-x", budget_gpu_minutes=5)).status_code == 409

    b.objects[BUDGETS].clear()
    assert (await syncer.run_pass()).released == ["b/team-x"]
    assert await own_budget(syncer, "b/team-x") is None
    assert (await local.run_pass()).released == []
    assert (await api.budget("team-x"))["budget_gpu_minutes"] == 100
    assert (await api.put_budget("team-x", budget_gpu_minutes=5)).status_code == 409  # still the hub's object


@pytest.mark.parametrize(
    "namespace",
    ["a/team-x", "../team-x", "", "Team-X", "x" * 64, None],
    ids=["another-key", "dots", "empty", "upper", "too-long", "none"],
)
async def test_a_members_object_whose_namespace_is_not_one_of_its_namespaces_governs_nothing(
    member: tuple[GitOpsSync, Cluster], namespace: str | None
) -> None:
    """A hostile member's API server may answer anything: a namespace that is not one DNS label would make
    a key of another cluster (`b/a/team-x` reads as cluster `b/a`), or the hub's own."""
    syncer, b = member
    b.add("team-y", {"budgetGPUMinutes": 7})
    b.add("team-x", {"budgetGPUMinutes": 1000}, name="evil")
    b.objects[BUDGETS][-1]["metadata"]["namespace"] = namespace

    result = await syncer.run_pass()
    assert result.applied == ["GPUBudget b/team-y/budget"]  # the well-formed one alone
    for key in ("team-x", "a/team-x", "b/a/team-x", "b/team-x", "b/", "b/Team-X"):
        assert await own_budget(syncer, key) is None
    assert "status" not in b.objects[BUDGETS][-1]


async def test_a_member_never_sets_the_default_and_hostile_metadata_is_ignored(
    member: tuple[GitOpsSync, Cluster], api: Api
) -> None:
    """The default is the hub's: a member's sync does not even list GPUBudgetDefaults. An object without a
    uid or with a name no API server gives, or a spec that is no object, changes nothing either."""
    syncer, b = member
    before = ok(await api.get("/defaults"))
    b.objects[DEFAULTS].append(
        {
            "kind": "GPUBudgetDefault",
            "metadata": {"name": "default", "uid": "uid-default", "generation": 1},
            "spec": {"budgetGPUMinutes": 1},
        }
    )
    b.add("team-u", {"budgetGPUMinutes": 1})
    del b.objects[BUDGETS][-1]["metadata"]["uid"]
    b.add("team-n", {"budgetGPUMinutes": 1}, name="x (deleted)\ngitops:GPUBudget team-a/budget")
    b.add("team-s", {})
    b.objects[BUDGETS][-1]["spec"] = ["budgetGPUMinutes", 1]

    result = await syncer.run_pass()
    assert result.applied == []
    assert list(result.not_ready) == ["GPUBudget b/team-s/budget"]
    assert "spec is not an object" in result.not_ready["GPUBudget b/team-s/budget"]
    assert ok(await api.get("/defaults")) == before
    for key in ("b/team-u", "b/team-n", "b/team-s"):
        assert await own_budget(syncer, key) is None
    assert (await api.put_defaults(budget_gpu_minutes=5)).status_code == 200  # nothing claimed the default


async def test_a_member_that_cannot_be_reached_delays_no_other_clusters_sync(
    sync: tuple[GitOpsSync, Cluster], member: tuple[GitOpsSync, Cluster], api: Api
) -> None:
    local, hub = sync
    syncer, b = member
    b.away = True
    fleet = FleetGitOpsSync([syncer, local], local.metrics)
    hub.add("team-a", {"budgetGPUMinutes": 100})
    await fleet.start_leading()
    try:
        async with asyncio.timeout(10):
            await hub.written.wait()
    finally:
        await fleet.stop_leading()
    assert (await api.budget("team-a"))["budget_gpu_minutes"] == 100
    passes = {
        (sample.labels["cluster"], sample.labels["outcome"]): sample.value
        for metrics in (syncer.metrics, local.metrics)
        for metric in metrics.collect()
        for sample in metric.samples
        if sample.name == "timekeeper_gitops_passes_total"
    }
    assert passes[("b", "error")] >= 1
    assert passes[("", "ok")] >= 1
