"""The rules of the `kueue` running-pod action that need no API server: which Workloads are lowered, and
what a lowered one is given back (never more than its namespace's priority policy allows, whatever its
record says). The writes themselves are proven on the real API server (tests/cluster/test_kueue.py)."""

from __future__ import annotations

from typing import Any

import pytest

from timekeeper.metrics import DowngradeMetrics
from timekeeper.reconcile.kueue import (
    NO_PRIORITY,
    ORIGINAL_ANNOTATION,
    KueuePolicy,
    KueuePriorities,
    restored_priority,
)
from timekeeper.settings import Settings

REDUCED, IN_BUDGET = 10, 1000


def workload(
    priority: int | None = 5000,
    resources: dict[str, str] | None = None,
    record: str | None = None,
    priority_class: str = "urgent",
    finished: bool = False,
    namespace: str = "team-a",
) -> dict[str, Any]:
    annotations = {} if record is None else {ORIGINAL_ANNOTATION: record}
    container = {"name": "main", "resources": {"limits": resources or {"nvidia.com/gpu": "1"}}}
    spec: dict[str, Any] = {
        "priorityClassName": priority_class,
        "podSets": [{"name": "main", "count": 2, "template": {"spec": {"containers": [container]}}}],
    }
    if priority is not None:
        spec["priority"] = priority
    conditions = [{"type": "Finished", "status": "True"}] if finished else []
    return {
        "metadata": {"namespace": namespace, "name": "w", "annotations": annotations},
        "spec": spec,
        "status": {"conditions": conditions},
    }


def policy(
    user_classes: str = "keep_up_to_ceiling", ceiling: int | None = None, exempt: tuple = ()
) -> KueuePolicy:
    return KueuePolicy(
        lowering=True, exempt_classes=frozenset(exempt), user_classes=user_classes, ceiling=ceiling
    )


def to_lower(item: dict[str, Any], namespace_policy: KueuePolicy, **settings: Any) -> bool:
    priorities = KueuePriorities(None, None, Settings(**settings), None, DowngradeMetrics())  # type: ignore[arg-type]
    return priorities._to_lower(item, namespace_policy, REDUCED)


@pytest.mark.parametrize(
    ("namespace_policy", "bound"),
    [
        (policy(), IN_BUDGET),  # no ceiling: the in-budget class's value
        (policy(ceiling=300), 300),
        (policy(ceiling=9000), 9000),
        (policy("replace", ceiling=9000), IN_BUDGET),  # replace: the in-budget class, whatever the ceiling
    ],
)
def test_the_bound_is_the_policys_ceiling_else_the_in_budget_class(
    namespace_policy: KueuePolicy, bound: int
) -> None:
    assert namespace_policy.bound(IN_BUDGET) == bound


def test_without_the_in_budget_class_only_a_ceiling_bounds() -> None:
    assert policy().bound(None) is None
    assert policy(ceiling=300).bound(None) == 300


@pytest.mark.parametrize(
    ("record", "given"),
    [
        ("700", 700),  # below the bound: as it was
        ("5000", IN_BUDGET),  # above: the bound
        (str(2**31 - 1), IN_BUDGET),  # a forged record
        (NO_PRIORITY, None),  # it had none: none again
        (None, IN_BUDGET),  # the record removed
        ("high", IN_BUDGET),
        (str(2**31), IN_BUDGET),  # not an int32
        ("-5", -5),
    ],
)
def test_a_lowered_workload_gets_its_record_back_at_most_the_bound(
    record: str | None, given: int | None
) -> None:
    assert restored_priority(workload(priority=REDUCED, record=record), IN_BUDGET) == given


def test_gpu_workloads_above_the_reduced_value_are_lowered() -> None:
    assert to_lower(workload(priority=5000), policy())
    assert to_lower(workload(priority=REDUCED + 1, resources={"nvidia.com/mig-1g.10gb": "1"}), policy())


@pytest.mark.parametrize(
    "item",
    [
        workload(priority=REDUCED),  # at the reduced value already
        workload(priority=3),  # below it: never raised
        workload(priority=None),  # none: 0
        workload(resources={"cpu": "4"}),  # no GPU
        workload(finished=True),
    ],
    ids=["reduced", "below", "none", "cpu", "finished"],
)
def test_others_are_left_alone(item: dict[str, Any]) -> None:
    assert not to_lower(item, policy())


def test_an_exempt_class_is_kept_only_where_an_admin_listed_the_namespace() -> None:
    critical = policy(exempt=("system-cluster-critical",))
    item = workload(priority_class="system-cluster-critical")

    assert not to_lower(item, critical, exempt_namespaces={"*": ["team-a"]})
    assert to_lower(item, critical, exempt_namespaces={"*": ["kube-system"]})
    assert to_lower(item, policy(), exempt_namespaces={"*": ["team-a"]})  # the policy does not exempt it
