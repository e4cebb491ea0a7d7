"""The snapshot's published form: distinct policies by index, entries equal to the default left out, and
`resolve` giving every namespace exactly the entry it was published with."""

from __future__ import annotations

import random
from typing import cast

import pytest

from gpuaccounting.admission_state import (
    ANY_CLASS,
    DEFAULT_EXEMPT_NAMESPACES,
    MODEL_POLICIES,
    USER_CLASS_RULES,
    NamespaceAdmission,
    PriorityPolicy,
    compact,
    default_priority_policy,
    is_exempt,
    resolve,
)
from gpuaccounting.wire import BUDGET_STATES

CLASSES = {"in_budget": "gpu-in-budget", "over_budget": "gpu-over-budget"}


def random_policy(rng: random.Random) -> PriorityPolicy:
    return {
        "exempt_classes": sorted(rng.sample(["a", "b", "system-node-critical"], rng.randint(0, 2))),
        "user_classes": rng.choice(USER_CLASS_RULES),
        "ceiling": rng.choice([None, 100, 1000]),
    }


def random_entry(rng: random.Random, policies: list[PriorityPolicy]) -> NamespaceAdmission:
    return {
        "state": rng.choice(BUDGET_STATES),
        "max_gpu_share_per_pod": rng.choice([None, 0.5, 2.0]),
        "priority_policy": rng.choice(policies),
        "exhausted_models": rng.choice([[], [], ["NVIDIA-H100-80GB-HBM3"], ["NVIDIA-A30", "NVIDIA-H200"]]),
        "model_policy": rng.choice(MODEL_POLICIES),
    }


@pytest.mark.parametrize("seed", range(20))
def test_every_namespace_resolves_to_the_entry_it_was_published_with(seed: int) -> None:
    rng = random.Random(seed)
    policies = [default_priority_policy(), *(random_policy(rng) for _ in range(rng.randint(0, 4)))]
    default = random_entry(rng, policies)
    namespaces = {f"team-{i}": random_entry(rng, policies) for i in range(rng.randint(0, 200))}

    published = compact(7, "2026-11-22T00:00:00Z", CLASSES, default, namespaces)
    resolved_default, listed = resolve(published)

    assert resolved_default == default
    for name, entry in namespaces.items():
        assert listed.get(name, resolved_default) == entry
    # Only the namespaces that differ from the default are listed, and every policy is sent once.
    assert set(listed) == {name for name, entry in namespaces.items() if entry != default}
    sent = published["priority_policies"]
    assert len(sent) == len({repr(policy) for policy in sent})
    assert published["default"]["priority_policy"] == 0


def test_a_policy_shared_by_many_namespaces_is_sent_once() -> None:
    strict: PriorityPolicy = {"exempt_classes": [], "user_classes": "replace", "ceiling": None}
    default: NamespaceAdmission = {
        "state": "in_budget",
        "max_gpu_share_per_pod": None,
        "priority_policy": default_priority_policy(),
        "exhausted_models": [],
        "model_policy": "reduce",
    }
    namespaces: dict[str, NamespaceAdmission] = {
        f"team-{i}": {**default, "state": "exhausted", "priority_policy": strict} for i in range(1000)
    }

    published = compact(1, "2026-11-22T00:00:00Z", CLASSES, default, namespaces)

    assert published["priority_policies"] == [default_priority_policy(), strict]
    assert {entry["priority_policy"] for entry in published["namespaces"].values()} == {1}


def test_an_index_that_names_no_policy_is_refused() -> None:
    published = compact(
        1,
        "2026-11-22T00:00:00Z",
        CLASSES,
        cast(
            NamespaceAdmission,
            {
                "state": "in_budget",
                "max_gpu_share_per_pod": None,
                "priority_policy": default_priority_policy(),
            },
        ),
        {},
    )
    published["namespaces"]["team-a"] = {
        "state": "exhausted",
        "max_gpu_share_per_pod": None,
        "priority_policy": 1,
    }

    with pytest.raises(ValueError, match="priority_policy 1"):
        resolve(published)


def test_an_older_timekeepers_entry_has_no_exhausted_model_and_reduces() -> None:
    """A snapshot without the model keys (a timekeeper before model budgets) resolves to their defaults; a
    newer one's are read as sent, and left out of the published form only where they are the defaults."""
    published = compact(
        1,
        "2026-11-22T00:00:00Z",
        CLASSES,
        cast(
            NamespaceAdmission,
            {
                "state": "in_budget",
                "max_gpu_share_per_pod": None,
                "priority_policy": default_priority_policy(),
            },
        ),
        {},
    )
    assert "exhausted_models" not in published["default"] and "model_policy" not in published["default"]
    published["namespaces"]["team-a"] = {
        "state": "in_budget",
        "max_gpu_share_per_pod": None,
        "priority_policy": 0,
        "exhausted_models": ["NVIDIA-H100-80GB-HBM3"],
        "model_policy": "steer",
    }

    default, listed = resolve(published)

    assert default["exhausted_models"] == [] and default["model_policy"] == "reduce"
    assert listed["team-a"]["exhausted_models"] == ["NVIDIA-H100-80GB-HBM3"]
    assert listed["team-a"]["model_policy"] == "steer"


def test_a_class_is_exempt_only_where_it_is_listed() -> None:
    """One rule for the webhook and the reconciler: the policy exempts the class, an admin the namespace."""
    classes = ["system-node-critical", "infra"]
    where = {"infra": ["ops"], ANY_CLASS: ["kube-system"]}
    assert is_exempt("system-node-critical", "kube-system", classes, where)
    assert not is_exempt("system-node-critical", "team-a", classes, where)
    assert is_exempt("infra", "ops", classes, where)
    assert not is_exempt("infra", "kube-system", classes, where)  # its own list replaces `*`
    assert not is_exempt("high", "kube-system", classes, where)  # not a class the policy exempts
    assert not is_exempt(None, "kube-system", classes, where)
    assert not is_exempt("infra", "ops", classes, {})  # listed nowhere: exempt nowhere


def test_by_default_the_system_classes_are_exempt_in_kube_system_and_our_namespace_only() -> None:
    classes = default_priority_policy()["exempt_classes"]
    for critical in ("system-node-critical", "system-cluster-critical"):
        assert [
            ns
            for ns in ("kube-system", "gpu-timekeeper", "team-a")
            if is_exempt(critical, ns, classes, DEFAULT_EXEMPT_NAMESPACES)
        ] == ["kube-system", "gpu-timekeeper"]
