"""Grants: listed for a namespace's readers, revoked by admins (audited), and optionally expiring inside
their period. A grant that ends no longer adds to the budget from then on, and the namespace's state (and
the admission snapshot) follows at once on a revocation, within one state sweep on an expiry."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi import FastAPI

from tests.support.timekeeper import Api, bearer, ok
from tests.timekeeper.conftest import START
from timekeeper.app import current
from timekeeper.clock import ManualClock
from timekeeper.periodic.jobs import JOBS_BY_NAME, run_job

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def spend(api: Api, clock: ManualClock, gpu_minutes: float, namespace: str = "team-a") -> str:
    """Four GPUs for a quarter of `gpu_minutes`, from now; answers the state the report left the
    namespace in."""
    start = clock.now()
    clock.advance(timedelta(minutes=gpu_minutes / 4))
    body = dict(namespace=namespace, pod_uid=f"uid-{namespace}", start=start, gpu_share=4)
    return str(ok(await api.report(**body, minutes=gpu_minutes / 4))["state"])


async def snapshot_state(api: Api, namespace: str) -> str:
    return str(ok(await api.get("/admission-state"))["namespaces"][namespace]["state"])


async def grants(api: Api, namespace: str, token: str | None = None, **params: Any) -> list[dict[str, Any]]:
    response = await api.client.get(
        f"/namespaces/{namespace}/grants", params=params, headers=bearer(token or api.tokens.reader)
    )
    return list(ok(response))


async def revoke(api: Api, namespace: str, grant_id: int, token: str | None = None) -> Any:
    return await api.client.delete(
        f"/namespaces/{namespace}/grants/{grant_id}", headers=bearer(token or api.tokens.admin)
    )


async def audit_actions(api: Api, namespace: str) -> list[str]:
    return [entry["action"] for entry in ok(await api.get("/audit", namespace=namespace))]


async def test_a_revoked_grant_no_longer_counts_and_the_snapshot_follows_at_once(
    api: Api, clock: ManualClock
) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=100))
    assert await spend(api, clock, 100) == "exhausted"
    grant = ok(await api.grant("team-a", 50, reason="paper deadline"))
    assert grant["status"] == "active"
    assert await snapshot_state(api, "team-a") == "in_budget"

    revoked = ok(await revoke(api, "team-a", grant["id"]))

    assert (revoked["status"], revoked["revoked_by"][:12]) == ("revoked", "admin-token:")
    assert revoked["ended_at"] == revoked["revoked_at"]
    assert (revoked["budget"]["granted_gpu_minutes"], revoked["budget"]["state"]) == (0, "exhausted")
    assert await snapshot_state(api, "team-a") == "exhausted"
    assert (await api.budget("team-a"))["remaining_gpu_minutes"] == 0
    assert await audit_actions(api, "team-a") == ["grant.revoke", "grant.create", "budget.put"]


async def test_revoking_counts_only_the_grants_left(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=100))
    first = ok(await api.grant("team-a", 30))
    ok(await api.grant("team-a", 12.5))

    ok(await revoke(api, "team-a", first["id"]))

    status = await api.budget("team-a")
    assert (status["granted_gpu_minutes"], status["remaining_gpu_minutes"]) == (12.5, 112.5)


async def test_revoking_twice_answers_the_grant_unchanged_and_audits_once(
    api: Api, clock: ManualClock
) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=100))
    grant = ok(await api.grant("team-a", 50))
    first = ok(await revoke(api, "team-a", grant["id"]))
    clock.advance(timedelta(minutes=5))

    again = ok(await revoke(api, "team-a", grant["id"]))

    assert again["revoked_at"] == first["revoked_at"]
    assert (await audit_actions(api, "team-a")).count("grant.revoke") == 1


async def test_revoking_a_grant_that_is_not_the_namespaces_is_404(api: Api) -> None:
    grant = ok(await api.grant("team-a", 50))

    assert (await revoke(api, "team-b", grant["id"])).status_code == 404
    assert (await revoke(api, "team-a", grant["id"] + 1000)).status_code == 404
    assert (await revoke(api, "team-a", 0)).status_code == 422
    assert (await api.budget("team-a"))["granted_gpu_minutes"] == 50


async def test_only_an_admin_revokes_and_a_reader_lists(api: Api) -> None:
    grant = ok(await api.grant("team-a", 50))

    assert (await revoke(api, "team-a", grant["id"], token=api.tokens.reader)).status_code == 403
    assert (await api.client.get("/namespaces/team-a/grants")).status_code == 401
    assert [entry["status"] for entry in await grants(api, "team-a")] == ["active"]


async def test_an_expired_grant_stops_counting_from_its_expiry(
    api: Api, app: FastAPI, clock: ManualClock
) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=100))
    assert await spend(api, clock, 110) == "exhausted"
    expires_at = clock.now() + timedelta(hours=1)
    grant = ok(await api.grant("team-a", 50, expires_at=expires_at.isoformat()))
    assert (grant["budget"]["state"], await snapshot_state(api, "team-a")) == ("in_budget", "in_budget")

    clock.advance(timedelta(minutes=59))
    await run_job(JOBS_BY_NAME["states"], current(app).sessions, current(app).settings, clock, "test")
    assert (await api.budget("team-a"))["granted_gpu_minutes"] == 50  # not yet

    clock.advance(timedelta(minutes=2))
    result = await run_job(JOBS_BY_NAME["states"], current(app).sessions, current(app).settings, clock, "t")

    assert result.detail == {"grants_expired_in": ["team-a"]}
    status = await api.budget("team-a")
    assert (status["granted_gpu_minutes"], status["state"]) == (0, "exhausted")
    assert await snapshot_state(api, "team-a") == "exhausted"
    [listed] = await grants(api, "team-a")
    assert (listed["status"], listed["ended_at"]) == ("expired", listed["expires_at"])
    # Expiry is not an admin change: nothing audited beyond the grant itself.
    assert await audit_actions(api, "team-a") == ["grant.create", "budget.put"]


async def test_expiry_must_fall_after_now_and_inside_the_current_period(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=100, period="daily"))
    end_of_day = START.replace(hour=0) + timedelta(days=1)

    past = await api.grant("team-a", 5, expires_at=(START - timedelta(seconds=1)).isoformat())
    beyond = await api.grant("team-a", 5, expires_at=(end_of_day + timedelta(seconds=1)).isoformat())
    naive = await api.grant("team-a", 5, expires_at="2026-03-18T13:00:00")
    at_the_end = await api.grant("team-a", 5, expires_at=end_of_day.isoformat())

    assert (past.status_code, beyond.status_code, naive.status_code) == (422, 422, 422)
    assert "end of the current period" in past.json()["detail"]
    assert ok(at_the_end)["expires_at"] == "2026-03-19T00:00:00Z"
    assert (await api.budget("team-a"))["granted_gpu_minutes"] == 5


async def test_grants_are_listed_newest_first_with_their_status_and_paged(
    api: Api, clock: ManualClock
) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=100, period="daily"))
    yesterdays = ok(await api.grant("team-a", 1))
    clock.advance(timedelta(days=1))
    kept = ok(await api.grant("team-a", 2))
    revoked = ok(await api.grant("team-a", 3))
    ok(await revoke(api, "team-a", revoked["id"]))
    ok(await api.grant("team-b", 4))

    listed = await grants(api, "team-a")
    page = await grants(api, "team-a", limit=1, before_id=kept["id"])

    assert [(g["id"], g["status"]) for g in listed] == [
        (revoked["id"], "revoked"),
        (kept["id"], "active"),
        (yesterdays["id"], "lapsed"),
    ]
    assert [g["id"] for g in page] == [yesterdays["id"]]
    refused = await api.client.get(
        "/namespaces/team-a/grants", params={"limit": 0}, headers=bearer(api.tokens.reader)
    )
    assert refused.status_code == 422


async def test_a_rebuilt_total_leaves_out_ended_grants(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=100, period="monthly"))
    revoked = ok(await api.grant("team-a", 30))
    ok(await api.grant("team-a", 7))
    ok(await revoke(api, "team-a", revoked["id"]))

    # A new period kind rebuilds the totals from the ledger and the grants.
    ok(await api.put_budget("team-a", budget_gpu_minutes=100, period="weekly"))

    assert (await api.budget("team-a"))["granted_gpu_minutes"] == 7
