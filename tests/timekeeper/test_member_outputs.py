"""What the outputs say of a fleet's namespaces (FLEET.md rule 7): `team-x` of the local cluster and of
members `a` and `b` are three namespaces. /metrics labels each series `cluster` (the member's name; no
label for the local cluster, so a single cluster's scrape is unchanged) beside the bare `namespace`; the
usage, efficiency, idle, budget and grant answers name the bare namespace and the cluster (null locally)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.timekeeper import Api, bearer, ok
from tests.timekeeper.member_usage import charge
from timekeeper.app import current
from timekeeper.auth.base import Principal
from timekeeper.budgets.schemas import GrantIn
from timekeeper.budgets.service import BudgetService
from timekeeper.clock import ManualClock
from timekeeper.domain.clusters import split_key
from timekeeper.metrics import PodWatchCollector
from timekeeper.settings import Settings
from timekeeper.usage.efficiency import EfficiencyService
from timekeeper.usage.service import UsageService

pytestmark = pytest.mark.asyncio(loop_scope="session")

KEYS = ("team-x", "a/team-x", "b/team-x")
SHARES = {"team-x": 1, "a/team-x": 1, "b/team-x": 2}


def gpu(util: float) -> list[dict[str, Any]]:
    """A GPU no source names a model for: its pod counts as one without a known model."""
    return [{"uuid": "GPU-0", "sm_util_pct": util, "mem_used_bytes": None, "mem_total_bytes": None}]


@pytest.fixture
async def idle_pods(app: FastAPI, clock: ManualClock) -> datetime:
    """A pod in team-x of each cluster, 70 minutes at 1 % in 10-minute reports: idle, of no known model.
    The three have one uid: a uid is unique in its own cluster only (pod keys, domain/clusters.py)."""
    start = clock.now()
    clock.set(start + timedelta(minutes=70))
    for key in KEYS:
        for minute in range(0, 70, 10):
            body = dict(pod="idle", pod_uid="uid-idle", seq=minute, minutes=10)
            when = start + timedelta(minutes=minute)
            await charge(app, key, **body, start=when, gpu_share=SHARES[key], gpus=gpu(1.0))
    return start


def series(scrape: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of `name` in a scrape, by their labels (sorted pairs)."""
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(scrape)
        for sample in family.samples
        if sample.name == name
    }


def labelled(key: str, **more: str) -> tuple[tuple[str, str], ...]:
    """The labels a namespace key's series carry: `cluster` only for a member's."""
    cluster, namespace = split_key(key)
    labels = {"namespace": namespace, **more} | ({} if cluster is None else {"cluster": cluster})
    return tuple(sorted(labels.items()))


async def test_each_clusters_namespace_is_a_series_of_its_own(api: Api, idle_pods: datetime) -> None:
    scrape = (await api.client.get("/metrics")).text

    assert series(scrape, "timekeeper_namespace_used_gpu_minutes") == {
        labelled(key): 70.0 * SHARES[key] for key in KEYS
    }
    assert series(scrape, "timekeeper_idle_gpu_pods") == {labelled(key): 1.0 for key in KEYS}
    assert series(scrape, "timekeeper_idle_gpus") == {labelled(key): float(SHARES[key]) for key in KEYS}
    assert series(scrape, "timekeeper_pods_without_gpu_model") == {labelled(key): 1.0 for key in KEYS}
    states = series(scrape, "timekeeper_namespace_state")
    assert {labels for labels, value in states.items() if value == 1} == {
        labelled(key, state="unlimited")
        for key in KEYS  # no budget set
    }
    # The local cluster's series read as they did before fleets.
    assert 'timekeeper_idle_gpu_pods{namespace="team-x"} 1.0' in scrape
    assert 'timekeeper_idle_gpu_pods{cluster="a",namespace="team-x"} 1.0' in scrape


async def test_the_pod_watchs_series_name_the_cluster_too() -> None:
    collector = PodWatchCollector()
    collector.counts = {"team-x": (2, 1), "a/team-x": (3, 0)}
    registry = CollectorRegistry()
    registry.register(collector)

    scrape = generate_latest(registry).decode()

    assert series(scrape, "timekeeper_running_gpu_pods") == {labelled("team-x"): 2, labelled("a/team-x"): 3}
    assert series(scrape, "timekeeper_silent_gpu_pods") == {labelled("team-x"): 1, labelled("a/team-x"): 0}


async def test_the_usage_answers_name_the_cluster_beside_the_bare_namespace(
    api: Api, app: FastAPI, idle_pods: datetime, settings: Settings, clock: ManualClock
) -> None:
    async with current(app).reads() as session:
        usage = {
            key: await UsageService(session, settings, clock).usage(key, None, None, "pod") for key in KEYS
        }
        efficiency = {
            key: await EfficiencyService(session, settings, clock).efficiency(key, idle_pods, None)
            for key in KEYS
        }

    for key in KEYS:
        cluster = split_key(key)[0]
        assert (usage[key].namespace, usage[key].cluster) == ("team-x", cluster)
        assert usage[key].total_gpu_minutes == 70 * SHARES[key]
        assert (efficiency[key].namespace, efficiency[key].cluster) == ("team-x", cluster)
        assert efficiency[key].allocated_gpu_minutes == 70 * SHARES[key]
    idle = ok(await api.client.get("/idle-pods", headers=bearer(api.tokens.reader)))
    assert sorted(
        (pod["cluster"] or "", pod["namespace"], pod["pod_uid"], pod["gpu_share"]) for pod in idle["pods"]
    ) == [
        ("", "team-x", "uid-idle", 1),
        ("a", "team-x", "uid-idle", 1),
        ("b", "team-x", "uid-idle", 2),
    ]
    # Over HTTP, a local namespace's answer is the one it was, with `cluster` null beside it.
    local = ok(await api.get("/namespaces/team-x/usage"))
    assert (local["namespace"], local["cluster"], local["total_gpu_minutes"]) == ("team-x", None, 70)


async def test_the_budget_answers_name_the_cluster_beside_the_bare_namespace(
    api: Api, app: FastAPI, idle_pods: datetime, settings: Settings, clock: ManualClock
) -> None:
    admin = Principal(name="hub-admin")
    async with current(app).sessions() as session, session.begin():
        budgets = BudgetService(session, settings, clock)
        granted = await budgets.grant("a/team-x", GrantIn(gpu_minutes=5, reason="fleet"), admin)
        listed = await budgets.grants("a/team-x", 10, None)
        status = await budgets.status("b/team-x")

    assert (granted.namespace, granted.cluster) == ("team-x", "a")
    assert (granted.budget.namespace, granted.budget.cluster) == ("team-x", "a")
    assert [(entry.namespace, entry.cluster) for entry in listed] == [("team-x", "a")]
    assert (status.namespace, status.cluster, status.used_gpu_minutes) == ("team-x", "b", 140)
    # The hub's listing: every cluster's team-x, each named as the usage answers name it.
    listing = ok(await api.get("/namespaces"))
    assert sorted(
        (entry["cluster"] or "", entry["namespace"], entry["used_gpu_minutes"]) for entry in listing
    ) == [
        ("", "team-x", 70),
        ("a", "team-x", 70),
        ("b", "team-x", 140),
    ]
    # A local namespace's answers are the ones they were, with `cluster` null beside the namespace.
    local = ok(await api.get("/namespaces/team-x/budget"))
    assert (local["namespace"], local["cluster"]) == ("team-x", None)
    ok(
        await api.client.post(
            "/namespaces/team-x/grants",
            json={"gpu_minutes": 1, "reason": "local"},
            headers=bearer(api.tokens.admin),
        )
    )
    [grant] = ok(await api.get("/namespaces/team-x/grants"))
    assert (grant["namespace"], grant["cluster"]) == ("team-x", None)
