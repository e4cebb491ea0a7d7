"""Every admin change lands in the audit log: who, when, old value, new value."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.support.timekeeper import Api, bearer, ok
from tests.timekeeper.conftest import START
from timekeeper.clock import ManualClock

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
