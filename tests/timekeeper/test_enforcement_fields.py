"""The enforcement fields of a budget: the priority policy the webhook applies and the action on running
pods of an exhausted namespace. Set per namespace and on the defaults, answered with where each value
came from, audited, and published in the admission snapshot resolved per namespace."""

from __future__ import annotations

from typing import Any

import pytest

from gpuaccounting.admission_state import default_priority_policy, resolve
from tests.support.timekeeper import Api, ok

pytestmark = pytest.mark.asyncio(loop_scope="session")

STRICT = {"exempt_classes": ["system-node-critical"], "user_classes": "replace", "ceiling": None}
CEILING = {
    "exempt_classes": ["system-node-critical", "infra-critical"],
    "user_classes": "keep_up_to_ceiling",
    "ceiling": 500,
}


def enforcement(status: dict[str, Any]) -> tuple[Any, ...]:
    return (
        status["priority_policy"],
        status["priority_policy_source"],
        status["running_pod_action"],
        status["running_pod_action_source"],
    )


async def test_a_namespace_sets_both_fields_and_reads_them_back(api: Api) -> None:
    written = ok(
        await api.put_budget(
            "team-a", budget_gpu_minutes=10, priority_policy=CEILING, running_pod_action="evict"
        )
    )

    # Exempt classes come back sorted, each once.
    policy = {**CEILING, "exempt_classes": ["infra-critical", "system-node-critical"]}
    assert enforcement(written) == enforcement(await api.budget("team-a"))
    assert enforcement(written) == (policy, "namespace", "evict", "namespace")


async def test_kueue_is_an_action_of_the_namespaces_and_of_the_defaults(api: Api) -> None:
    """`kueue` lowers Kueue Workloads' priority (timekeeper/reconcile/kueue.py); stored past the check."""
    ok(await api.put_defaults(running_pod_action="kueue"))
    ok(await api.put_budget("team-a", budget_gpu_minutes=10, running_pod_action="kueue"))

    assert enforcement(await api.budget("team-a"))[2:] == ("kueue", "namespace")
    assert enforcement(await api.budget("team-b"))[2:] == ("kueue", "default")


async def test_a_namespace_follows_the_defaults_until_it_sets_its_own(api: Api) -> None:
    ok(await api.put_defaults(priority_policy=STRICT, running_pod_action="evict"))
    ok(await api.put_budget("team-b", budget_gpu_minutes=10))  # its own budget, the default's policy

    assert enforcement(await api.budget("team-a")) == (STRICT, "default", "evict", "default")
    assert enforcement(await api.budget("team-b")) == (STRICT, "default", "evict", "default")
    defaults = ok(await api.get("/defaults"))
    assert (defaults["priority_policy"], defaults["running_pod_action"]) == (STRICT, "evict")


async def test_omitted_fields_keep_their_value_and_null_returns_to_the_default(api: Api) -> None:
    ok(await api.put_budget("team-a", priority_policy=STRICT, running_pod_action="evict"))

    # A client that predates the fields re-sends the v1 body: the enforcement fields stay as they were.
    kept = ok(await api.put_budget("team-a", budget_gpu_minutes=20))
    inherited = ok(await api.put_budget("team-a", priority_policy=None, running_pod_action=None))

    assert kept["budget_gpu_minutes"] == 20
    assert enforcement(kept) == (STRICT, "namespace", "evict", "namespace")
    assert enforcement(inherited) == (default_priority_policy(), "default", "none", "default")


async def test_on_the_defaults_omitted_keeps_and_null_restores_the_shipped_default(api: Api) -> None:
    ok(await api.put_defaults(priority_policy=STRICT, running_pod_action="evict"))

    kept = ok(await api.put_defaults(budget_gpu_minutes=5))
    shipped = ok(await api.put_defaults(priority_policy=None, running_pod_action=None))

    assert (kept["priority_policy"], kept["running_pod_action"]) == (STRICT, "evict")
    assert (shipped["priority_policy"], shipped["running_pod_action"]) == (default_priority_policy(), "none")


async def test_deleting_a_budget_returns_its_enforcement_fields_to_the_default(api: Api) -> None:
    ok(await api.put_budget("team-a", priority_policy=STRICT, running_pod_action="evict"))

    deleted = ok(await api.delete_budget("team-a"))

    assert enforcement(deleted) == (default_priority_policy(), "default", "none", "default")


async def test_changes_to_both_fields_are_audited_with_old_and_new_values(api: Api) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=10))
    ok(
        await api.put_budget(
            "team-a", budget_gpu_minutes=10, priority_policy=STRICT, running_pod_action="evict"
        )
    )
    ok(await api.put_defaults(priority_policy=CEILING, running_pod_action="evict"))

    first, second, defaults = reversed(ok(await api.get("/audit")))

    assert (first["new_value"]["priority_policy"], first["new_value"]["running_pod_action"]) == (None, None)
    assert (second["old_value"]["priority_policy"], second["old_value"]["running_pod_action"]) == (None, None)
    assert (second["new_value"]["priority_policy"], second["new_value"]["running_pod_action"]) == (
        STRICT,
        "evict",
    )
    assert defaults["action"] == "defaults.put"
    assert (defaults["old_value"]["priority_policy"], defaults["old_value"]["running_pod_action"]) == (
        default_priority_policy(),
        "none",
    )
    assert defaults["new_value"]["priority_policy"]["ceiling"] == 500
    assert defaults["new_value"]["running_pod_action"] == "evict"


async def test_the_snapshot_carries_each_namespaces_resolved_policy(api: Api) -> None:
    ok(await api.put_defaults(budget_gpu_minutes=50, priority_policy=CEILING))
    ok(await api.put_budget("own-policy", budget_gpu_minutes=0, priority_policy=STRICT))
    ok(await api.put_budget("own-budget-only", budget_gpu_minutes=0))
    ok(await api.grant("on-default", 1))
    before = ok(await api.get("/admission-state"))

    ok(await api.put_budget("own-budget-only", budget_gpu_minutes=0, priority_policy=STRICT))
    after = ok(await api.get("/admission-state"))

    default_policy = ok(await api.get("/defaults"))["priority_policy"]
    default, listed = resolve(before)
    assert default["priority_policy"] == default_policy
    assert {ns: entry["priority_policy"] for ns, entry in listed.items()} == {
        "own-policy": STRICT,
        "own-budget-only": default_policy,  # listed for its state (exhausted), with the default's policy
    }
    assert "on-default" not in listed  # its entry is the default's: governed by it
    assert after["version"] > before["version"]
    assert resolve(after)[1]["own-budget-only"]["priority_policy"] == STRICT


@pytest.mark.parametrize(
    "fields",
    [
        {"running_pod_action": "delete"},
        {"priority_policy": {**STRICT, "exempt_classes": ["Not_A_Name"]}},
        {"priority_policy": {**STRICT, "exempt_classes": ["a" * 254]}},
        {"priority_policy": {**STRICT, "ceiling": -1}},
        {"priority_policy": {**STRICT, "ceiling": 2**31}},
        {"priority_policy": {**STRICT, "ceiling": 1.5}},
        {"priority_policy": {**STRICT, "ceiling": True}},
        {"priority_policy": {**STRICT, "ceiling": "5"}},
        {"priority_policy": {**STRICT, "user_classes": "keep"}},
        {"priority_policy": {**STRICT, "colour": "red"}},
        {"priority_policy": {"exempt_classes": [], "user_classes": "replace"}},  # ceiling left out
        {"priority_policy": "strict"},
    ],
)
async def test_malformed_enforcement_fields_are_refused_and_change_nothing(
    api: Api, fields: dict[str, Any]
) -> None:
    namespace = await api.put_budget("team-a", **fields)
    defaults = await api.put_defaults(**fields)

    assert (namespace.status_code, defaults.status_code) == (422, 422)
    assert ok(await api.get("/audit")) == []
