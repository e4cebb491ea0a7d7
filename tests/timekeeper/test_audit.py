"""Every admin change lands in the audit log: who, when, old value, new value."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi import FastAPI

from tests.support.timekeeper import Api, bearer, ok
from tests.timekeeper.conftest import START
from timekeeper.app import current
from timekeeper.auth.base import Principal
from timekeeper.budgets.pools.schemas import PoolIn
from timekeeper.budgets.pools.service import PoolService
from timekeeper.budgets.schemas import GrantIn
from timekeeper.budgets.service import BudgetService
from timekeeper.clock import ManualClock
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_every_admin_change_is_audited_with_old_and_new_values(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=100))
    clock.advance(timedelta(minutes=1))
    ok(await api.put_budget("team-a", budget_gpu_minutes=200, period="weekly"))
    ok(await api.grant("team-a", 25, reason="conference"))
    ok(await api.delete_budget("team-a"))
    ok(await api.put_defaults(budget_gpu_minutes=10))

    entries = list(reversed(ok(await api.get("/audit"))))

    assert [(entry["action"], entry["namespace"]) for entry in entries] == [
        ("budget.put", "team-a"),
        ("budget.put", "team-a"),
        ("grant.create", "team-a"),
        ("budget.delete", "team-a"),
        ("defaults.put", None),
    ]
    assert all(entry["actor"].startswith("admin-token:") for entry in entries)
    first, second, grant, deletion, defaults = entries
    assert first["old_value"] is None and first["new_value"]["budget_gpu_minutes"] == "100"
    assert first["at"] == "2026-03-18T12:00:00Z" and second["at"] == "2026-03-18T12:01:00Z"
    assert second["old_value"]["budget_gpu_minutes"] == "100"
    assert (second["new_value"]["budget_gpu_minutes"], second["new_value"]["period"]) == ("200", "weekly")
    assert grant["new_value"]["gpu_minutes"] == "25" and grant["new_value"]["reason"] == "conference"
    assert deletion["old_value"]["budget_gpu_minutes"] == "200" and deletion["new_value"] is None
    assert defaults["old_value"]["budget_gpu_minutes"] is None
    assert defaults["new_value"]["budget_gpu_minutes"] == "10"


async def test_reports_are_not_admin_changes(api: Api) -> None:
    ok(await api.report(seq=1, start=START - timedelta(minutes=5)))

    assert ok(await api.get("/audit")) == []


async def test_the_audit_log_filters_by_namespace_and_pages(api: Api) -> None:
    for namespace in ("team-a", "team-b", "team-a"):
        ok(await api.grant(namespace, 1))

    team_a = ok(await api.get("/audit", namespace="team-a"))
    first_page = ok(await api.get("/audit", limit=2))
    second_page = ok(await api.get("/audit", limit=2, before_id=first_page[-1]["id"]))

    assert [entry["namespace"] for entry in team_a] == ["team-a", "team-a"]
    assert len(first_page) == 2 and len(second_page) == 1


async def test_only_admins_read_the_audit_log(api: Api) -> None:
    response = await api.client.get("/audit", headers=bearer(api.tokens.reader))

    assert response.status_code == 403


async def test_each_entry_names_the_cluster_that_authenticated_its_actor(
    api: Api, app: FastAPI, settings: Settings, clock: ManualClock
) -> None:
    """`alice` of the hub and `alice` of member `b` are two people (docs/fleet.md): each entry, and a
    pool's `updated_by`, carry the cluster whose API server authenticated the actor (null: the hub's)."""
    hubs, bs = Principal(name="alice"), Principal(name="alice", cluster="b")
    async with current(app).sessions() as session, session.begin():
        budgets = BudgetService(session, settings, clock)
        await budgets.grant("team-x", GrantIn(gpu_minutes=1, reason="hub"), hubs)
        await budgets.grant("b/team-x", GrantIn(gpu_minutes=2, reason="b"), bs)
        pool = await PoolService(session, settings, clock).put(
            "team-x-b", PoolIn(budget_gpu_minutes=5, members=[{"namespace": "team-x"}]), bs
        )

    entries = list(reversed(ok(await api.get("/audit"))))

    assert [(e["action"], e["namespace"], e["actor"], e["actor_cluster"]) for e in entries] == [
        ("grant.create", "team-x", "alice", None),
        ("grant.create", "b/team-x", "alice", "b"),
        ("pool.put", None, "alice", "b"),
    ]
    assert (pool.updated_by, pool.updated_by_cluster) == ("alice", "b")
    assert ok(await api.get("/pools/team-x-b"))["updated_by_cluster"] == "b"
    # An admin's change over HTTP (the hub's own cluster): null.
    ok(await api.grant("team-y", 1))
    assert ok(await api.get("/audit", limit=1))[0]["actor_cluster"] is None
