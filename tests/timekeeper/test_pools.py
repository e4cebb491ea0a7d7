"""Pools: one budget shared by several namespaces (listed, or chosen by their labels), with optional caps
per member. A member is exhausted when its pool or its cap is, and the admission snapshot carries that
state, so the webhook gives the next pod of every member the right class."""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from tests.support.postgres import url_string
from tests.support.timekeeper import Api, Tokens, bearer, ok, sha256
from timekeeper.budgets.pools.repository import PoolRepository
from timekeeper.clock import ManualClock
from timekeeper.settings import Settings
from webhook.decisions.priority import PriorityDecider, PriorityRule
from webhook.settings import WebhookSettings
from webhook.watches.budgetcache import BudgetStateCache
from webhook.watches.priorityclasses import PriorityClassCatalog

pytestmark = pytest.mark.asyncio(loop_scope="session")

TEAM_A_READER = secrets.token_urlsafe(24)


@pytest.fixture
def settings(database_url: URL, tokens: Tokens) -> Settings:
    return Settings(
        database_url=url_string(database_url),
        scheduler_enabled=False,
        reader_tokens={sha256(TEAM_A_READER): ["team-a"]},
        **tokens.settings(),
    )


async def put_pool(api: Api, name: str, token: str | None = None, **body: Any) -> Any:
    body = {"budget_gpu_minutes": 100, "period": "monthly", **body}
    return await api.client.put(f"/pools/{name}", json=body, headers=bearer(token or api.tokens.admin))


def members(*namespaces: str, **caps: float) -> list[dict[str, Any]]:
    return [{"namespace": ns, "cap_gpu_minutes": caps.get(ns.replace("-", "_"))} for ns in namespaces]


async def spend(api: Api, clock: ManualClock, namespace: str, gpu_minutes: float) -> str:
    """Four GPUs for a quarter of `gpu_minutes`, ending now; answers the state the report answered."""
    start = clock.now() - timedelta(minutes=gpu_minutes / 4)
    pod = secrets.token_hex(4)
    body = dict(namespace=namespace, pod=f"p-{pod}", pod_uid=f"uid-{pod}", start=start, gpu_share=4)
    return str(ok(await api.report(**body, minutes=gpu_minutes / 4))["state"])


async def snapshot(api: Api) -> dict[str, Any]:
    return dict(ok(await api.get("/admission-state")))


async def next_pod(api: Api, namespace: str) -> PriorityRule:
    """The rule the webhook applies to the namespace's next GPU pod, from the snapshot it would cache."""
    cache = BudgetStateCache(max_age_seconds=60)
    cache.store(await snapshot(api), None)  # type: ignore[arg-type]
    policy = PriorityDecider(WebhookSettings(watch_priority_classes=False), PriorityClassCatalog())
    return policy.decide({}, cache.view(namespace), namespace=namespace).rule


async def test_a_pool_exhausted_by_one_member_downgrades_the_other_members_next_pod(
    api: Api, clock: ManualClock
) -> None:
    ok(await put_pool(api, "vision", budget_gpu_minutes=100, members=members("team-a", "team-b")))
    assert await spend(api, clock, "team-b", 10) == "in_budget"
    assert await next_pod(api, "team-a") == PriorityRule.IN_BUDGET

    assert await spend(api, clock, "team-a", 90) == "exhausted"  # the pool's 100 are spent

    states = {ns: entry["state"] for ns, entry in (await snapshot(api))["namespaces"].items()}
    assert (states["team-a"], states["team-b"]) == ("exhausted", "exhausted")
    assert await next_pod(api, "team-b") == PriorityRule.EXHAUSTED
    assert (await api.budget("team-b"))["state"] == "exhausted"
    pool = ok(await api.get("/pools/vision"))
    assert (pool["used_gpu_minutes"], pool["remaining_gpu_minutes"], pool["state"]) == (100, 0, "exhausted")
    metrics = (await api.client.get("/metrics")).text
    assert 'timekeeper_pool_used_gpu_minutes{pool="vision"} 100.0' in metrics
    assert 'timekeeper_pool_state{pool="vision",state="exhausted"} 1.0' in metrics


async def test_a_member_is_exhausted_by_its_cap_while_the_pool_lasts(api: Api, clock: ManualClock) -> None:
    ok(await put_pool(api, "vision", budget_gpu_minutes=100, members=members("team-a", "team-b", team_a=30)))

    assert await spend(api, clock, "team-a", 30) == "exhausted"

    pool = ok(await api.get("/pools/vision"))
    assert pool["state"] == "in_budget"
    assert {m["namespace"]: m["state"] for m in pool["members"]} == {
        "team-a": "exhausted",
        "team-b": "in_budget",
    }
    assert await next_pod(api, "team-a") == PriorityRule.EXHAUSTED
    assert await next_pod(api, "team-b") == PriorityRule.IN_BUDGET
    # A grant to the capped member lifts its cap and tops up the pool.
    ok(await api.grant("team-a", 5))
    pool = ok(await api.get("/pools/vision"))
    assert (pool["granted_gpu_minutes"], pool["remaining_gpu_minutes"]) == (5, 75)
    assert {m["namespace"]: m["state"] for m in pool["members"]}["team-a"] == "warning"  # 30 of 35


async def test_the_pool_governs_instead_of_the_members_own_budget(api: Api, clock: ManualClock) -> None:
    ok(await api.put_defaults(budget_gpu_minutes=10))  # alone, each would be exhausted at 10
    ok(await put_pool(api, "vision", budget_gpu_minutes=100, members=members("team-a", "team-b")))

    assert await spend(api, clock, "team-a", 40) == "in_budget"
    assert await spend(api, clock, "team-c", 10) == "exhausted"  # not a member: the default

    assert (await api.client.delete("/pools/vision", headers=bearer(api.tokens.admin))).status_code == 204

    assert (await api.budget("team-a"))["state"] == "exhausted"  # its own (default) budget again
    assert await next_pod(api, "team-a") == PriorityRule.EXHAUSTED


async def test_members_count_in_the_pools_period_from_what_they_charged_before_joining(
    api: Api, clock: ManualClock
) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=1000, period="daily"))
    clock.advance(timedelta(days=-3))
    await spend(api, clock, "team-a", 20)  # earlier this month
    clock.advance(timedelta(days=3))
    await spend(api, clock, "team-a", 8)  # today

    ok(await put_pool(api, "vision", budget_gpu_minutes=30, period="monthly", members=members("team-a")))

    status = await api.budget("team-a")
    assert (status["period"]["kind"], status["used_gpu_minutes"], status["pool"]) == ("monthly", 28, "vision")
    assert status["state"] == "warning"
    assert await spend(api, clock, "team-a", 2) == "exhausted"


async def test_a_selector_chooses_members_by_their_labels_and_a_listing_wins(
    api: Api, clock: ManualClock, connection: AsyncConnection
) -> None:
    session = AsyncSession(bind=connection, join_transaction_mode="create_savepoint")
    await PoolRepository(session).put_labels(
        {"team-a": {"org": "vision"}, "team-b": {"org": "vision", "tier": "gold"}, "team-c": {"org": "nlp"}},
        clock.now(),
    )
    await session.commit()
    ok(await put_pool(api, "other", members=members("team-b")))

    pool = ok(
        await put_pool(
            api, "vision", budget_gpu_minutes=5, namespace_selector={"matchLabels": {"org": "vision"}}
        )
    )

    assert [(m["namespace"], m["listed"]) for m in pool["members"]] == [("team-a", False)]
    assert await spend(api, clock, "team-a", 5) == "exhausted"
    assert (await api.budget("team-b"))["pool"] == "other"


async def test_a_selector_chooses_the_hubs_own_namespaces_only(
    api: Api, clock: ManualClock, connection: AsyncConnection
) -> None:
    """A member cluster's namespace labels are its admin's to write: were they stored (under its keys),
    they would still put no namespace of that cluster in a pool (docs/fleet.md#pools-across-clusters)."""
    session = AsyncSession(bind=connection, join_transaction_mode="create_savepoint")
    await PoolRepository(session).put_labels(
        {"team-a": {"org": "vision"}, "b/team-a": {"org": "vision"}, "b/team-c": {"org": "vision"}},
        clock.now(),
    )
    await session.commit()

    pool = ok(await put_pool(api, "vision", namespace_selector={"matchLabels": {"org": "vision"}}))

    assert [m["namespace"] for m in pool["members"]] == ["team-a"]


async def test_pools_are_audited_admin_changes(api: Api) -> None:
    ok(await put_pool(api, "vision", members=members("team-a")))
    ok(await put_pool(api, "vision", budget_gpu_minutes=50, members=members("team-a", "team-b", team_b=5)))
    assert (await api.client.delete("/pools/vision", headers=bearer(api.tokens.admin))).status_code == 204

    entries = ok(await api.get("/audit"))
    assert [e["action"] for e in entries[:3]] == ["pool.delete", "pool.put", "pool.put"]
    assert entries[1]["old_value"]["budget_gpu_minutes"] == "100"
    assert entries[1]["new_value"]["members"] == [
        {"namespace": "team-a", "cap_gpu_minutes": None},
        {"namespace": "team-b", "cap_gpu_minutes": "5"},
    ]


async def test_refusals(api: Api) -> None:
    ok(await put_pool(api, "vision", members=members("team-a")))

    elsewhere = await put_pool(api, "nlp", members=members("team-a"))
    twice = await put_pool(api, "nlp", members=members("team-b", "team-b"))
    by_reader = await put_pool(api, "nlp", token=api.tokens.reader)
    bad_label = await put_pool(api, "nlp", namespace_selector={"matchLabels": {"bad key!": "x"}})
    absent = await api.client.delete("/pools/nlp", headers=bearer(api.tokens.admin))

    assert elsewhere.status_code == 409 and "team-a (pool vision)" in elsewhere.json()["detail"]
    assert (twice.status_code, by_reader.status_code, bad_label.status_code) == (422, 403, 422)
    assert absent.status_code == 404


async def test_a_members_reader_reads_its_pool_and_no_other(api: Api) -> None:
    ok(await put_pool(api, "vision", members=members("team-a", "team-b")))
    ok(await put_pool(api, "nlp", members=members("team-c")))
    scoped = bearer(TEAM_A_READER)

    own = await api.client.get("/namespaces/team-a/pool", headers=scoped)
    listed = await api.client.get("/pools", headers=scoped)
    other = await api.client.get("/pools/nlp", headers=scoped)
    not_member = await api.client.get("/namespaces/team-d/pool", headers=bearer(api.tokens.reader))

    assert ok(own)["name"] == "vision"
    assert [pool["name"] for pool in ok(listed)] == ["vision"]
    assert (other.status_code, not_member.status_code) == (404, 404)
