"""The admission snapshot: its shape, a version that only grows, and cheap polling through ETags."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI

from gpuaccounting.admission_state import AdmissionSnapshot, default_priority_policy
from tests.support.timekeeper import Api, ok
from tests.timekeeper.conftest import START
from timekeeper.app import current
from timekeeper.clock import ManualClock
from timekeeper.periodic.jobs import JOBS_BY_NAME, run_job

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def snapshot(api: Api) -> tuple[AdmissionSnapshot, str]:
    response = await api.get("/admission-state")
    return ok(response), response.headers["etag"]


async def poll(api: Api, etag: str) -> httpx.Response:
    return await api.client.get(
        "/admission-state", headers={"If-None-Match": etag, "Authorization": f"Bearer {api.tokens.reader}"}
    )


async def test_the_snapshot_has_the_documented_shape(api: Api) -> None:
    ok(await api.put_defaults(budget_gpu_minutes=50, max_gpu_share_per_pod=1))
    ok(await api.put_budget("team-a", budget_gpu_minutes=0, max_gpu_share_per_pod=4))

    state, etag = await snapshot(api)

    assert etag == f'"{state["version"]}"'
    assert state["priority_classes"] == {"in_budget": "gpu-in-budget", "over_budget": "gpu-over-budget"}
    assert state["priority_policies"] == [default_priority_policy()]
    assert state["default"] == {"state": "in_budget", "max_gpu_share_per_pod": 1.0, "priority_policy": 0}
    assert state["namespaces"] == {
        "team-a": {"state": "exhausted", "max_gpu_share_per_pod": 4.0, "priority_policy": 0}
    }
    assert state["generated_at"] == "2026-03-18T12:00:00Z"


async def test_an_unchanged_snapshot_answers_304(api: Api) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=10))
    _, etag = await snapshot(api)

    response = await poll(api, etag)

    assert response.status_code == 304
    assert response.headers["etag"] == etag
    assert response.content == b""


async def test_a_weak_or_listed_etag_matches_too(api: Api) -> None:
    _, etag = await snapshot(api)

    assert (await poll(api, f'"0", W/{etag}')).status_code == 304


async def test_a_budget_change_gives_a_new_version(api: Api) -> None:
    _, before = await snapshot(api)
    ok(await api.put_budget("team-a", budget_gpu_minutes=10, max_gpu_share_per_pod=2))

    response = await poll(api, before)

    assert response.status_code == 200
    assert response.json()["version"] > int(before.strip('"'))
    assert response.json()["namespaces"]["team-a"]["max_gpu_share_per_pod"] == 2


async def test_a_report_that_changes_the_state_gives_a_new_version_and_one_that_does_not_keeps_it(
    api: Api,
) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=10))
    start = START - timedelta(minutes=30)
    ok(await api.report(seq=1, start=start, minutes=1))
    _, etag = await snapshot(api)

    ok(await api.report(seq=2, start=start + timedelta(minutes=1), minutes=1))
    assert (await poll(api, etag)).status_code == 304

    ack = ok(await api.report(seq=3, start=start + timedelta(minutes=2), minutes=10))
    assert ack["state"] == "exhausted"
    changed = await poll(api, etag)
    assert changed.status_code == 200
    assert changed.json()["namespaces"]["team-a"]["state"] == "exhausted"


async def test_at_a_period_roll_over_exhausted_namespaces_return_to_in_budget(
    api: Api, app: FastAPI, clock: ManualClock
) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=1, period="daily"))
    ok(await api.report(seq=1, start=START - timedelta(minutes=5), minutes=2))
    before, etag = await snapshot(api)
    assert before["namespaces"]["team-a"]["state"] == "exhausted"
    clock.set(datetime(2026, 3, 19, 0, 0, 5, tzinfo=UTC))

    # Reading writes nothing: until the roll-over job has run, the snapshot is the one last published.
    assert (await poll(api, etag)).status_code == 304
    context = current(app)
    await run_job(JOBS_BY_NAME["rollover"], context.sessions, context.settings, context.clock, "test")

    response = await poll(api, etag)
    assert response.status_code == 200
    assert response.json()["namespaces"]["team-a"]["state"] == "in_budget"
    assert response.json()["version"] > before["version"]


async def test_versions_only_grow(api: Api) -> None:
    versions = []
    for budget in (5, 6, 7):
        ok(await api.put_budget("team-a", budget_gpu_minutes=budget))
        versions.append((await snapshot(api))[0]["version"])

    assert versions == sorted(set(versions))


async def test_a_version_is_built_once_and_a_change_builds_the_next(api: Api, clock: ManualClock) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=10))
    first = await api.get("/admission-state")
    clock.advance(timedelta(minutes=5))

    again = await api.get("/admission-state")
    ok(await api.put_budget("team-a", budget_gpu_minutes=0))
    changed = await api.get("/admission-state")

    assert again.content == first.content  # the same bytes: built at the first GET, not rebuilt
    assert ok(again)["generated_at"] == "2026-03-18T12:00:00Z"
    assert ok(changed)["version"] > ok(first)["version"]
    assert ok(changed)["namespaces"]["team-a"]["state"] == "exhausted"
    assert ok(changed)["generated_at"] == "2026-03-18T12:05:00Z"
