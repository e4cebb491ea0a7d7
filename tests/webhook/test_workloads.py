"""One class per workload: the watched view of admitted GPU pods gives a workload's later pods the class of
its oldest pod, in any budget state, until none of its pods is left; a pod our webhook did not decide never
speaks for a workload."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kubernetes_asyncio import client

from gpuaccounting import names
from tests.webhook.test_priority import IN_BUDGET, REDUCED, catalog, outcome, view
from webhook.priority import PriorityDecider, PriorityRule
from webhook.settings import WebhookSettings
from webhook.workloads import WorkloadClass, WorkloadClasses

START = datetime(2026, 1, 1, tzinfo=UTC)
SETTINGS = WebhookSettings(watch_priority_classes=False)


def admitted(
    uid: str,
    workload: str = "Job/train",
    class_name: str = "gpu-in-budget",
    age: int = 0,
    namespace: str = "team-a",
    decided: bool = True,
    decision: str = "in-budget: no class chosen",
    state: str = "in_budget",
) -> client.V1Pod:
    annotations = {
        names.ANNOTATION_WORKLOAD: workload,
        names.ANNOTATION_GPU_SHARE: "1",
        names.ANNOTATION_BUDGET_STATE: state,
    }
    if decided:
        annotations[names.ANNOTATION_PRIORITY_DECISION] = decision
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=f"pod-{uid}",
            namespace=namespace,
            uid=uid,
            annotations=annotations,
            creation_timestamp=START + timedelta(seconds=age),
        ),
        spec=client.V1PodSpec(containers=[], priority_class_name=class_name, priority=7),
    )


def view_of(*pods: client.V1Pod) -> WorkloadClasses:
    classes = WorkloadClasses()
    classes.replace_all(pods)
    return classes


def test_a_workloads_class_is_its_oldest_pods() -> None:
    classes = view_of(admitted("b", class_name="gpu-over-budget", age=5), admitted("a", age=1))

    kept = classes.class_of("team-a", "Job/train")

    assert kept is not None and (kept.pod, kept.class_name) == ("pod-a", "gpu-in-budget")
    assert classes.class_of("team-b", "Job/train") is None  # the same name in another namespace
    assert classes.class_of("team-a", "Job/other") is None


def test_the_class_is_kept_until_the_workloads_last_pod_is_gone() -> None:
    first, second = admitted("a", age=1), admitted("b", class_name="gpu-over-budget", age=2)
    classes = view_of(first, second)

    classes.remove(first)
    kept = classes.class_of("team-a", "Job/train")
    assert kept is not None and kept.class_name == "gpu-over-budget"
    classes.remove(second)
    assert classes.class_of("team-a", "Job/train") is None
    assert classes.known() == 0


def test_an_ended_or_deleted_pod_keeps_no_class() -> None:
    ended, going = admitted("a", age=1), admitted("b", age=2)
    ended.status = client.V1PodStatus(phase="Succeeded")
    going.metadata.deletion_timestamp = START
    classes = view_of(ended, going)

    assert classes.class_of("team-a", "Job/train") is None
    classes.put(admitted("a", age=1))  # a MODIFIED event that ends a pod drops it, and back
    assert classes.class_of("team-a", "Job/train") is not None
    classes.put(ended)
    assert classes.class_of("team-a", "Job/train") is None


def test_a_pod_that_kept_its_workloads_class_while_exhausted_passes_it_on_to_no_one() -> None:
    """Else the replacements of an evicted workload, racing its eviction, would keep its class forever."""
    kept = "workload-class-kept: workload Job/train keeps class gpu-in-budget"
    classes = view_of(admitted("a", decision=kept, state="exhausted"))

    assert classes.class_of("team-a", "Job/train") is None
    classes.put(admitted("b", decision=kept, state="in_budget"))
    kept_class = classes.class_of("team-a", "Job/train")
    assert kept_class is not None and kept_class.pod == "pod-b"
    # A pod the budget reduced is a source in any state: the workload stays reduced when back in budget.
    reduced = admitted("c", class_name="gpu-over-budget", decision="exhausted: namespace exhausted")
    reduced_class = view_of(reduced).class_of("team-a", "Job/train")
    assert reduced_class is not None and reduced_class.class_name == "gpu-over-budget"


def test_a_pod_the_webhook_did_not_decide_or_a_bare_pod_speaks_for_no_workload() -> None:
    classes = view_of(admitted("a", decided=False), admitted("b", workload="Pod/b"))

    assert classes.class_of("team-a", "Job/train") is None
    assert classes.class_of("team-a", "Pod/b") is None


def test_a_pod_whose_workload_annotation_changes_moves() -> None:
    classes = view_of(admitted("a"))

    classes.put(admitted("a", workload="Job/other"))

    assert classes.class_of("team-a", "Job/train") is None
    assert classes.class_of("team-a", "Job/other") is not None


def kept_class(name: str) -> WorkloadClass:
    return WorkloadClass(START, "pod-a", name, 7, None)


def test_a_later_pod_of_an_in_budget_workload_keeps_the_in_budget_class_when_exhausted() -> None:
    decision = PriorityDecider(SETTINGS, catalog()).decide(
        {}, view("exhausted"), namespace="team-a", workload="Job/train", kept=kept_class("gpu-in-budget")
    )

    assert outcome(decision) == (PriorityRule.WORKLOAD_CLASS_KEPT, *IN_BUDGET)
    assert decision.annotation == "workload-class-kept: workload Job/train keeps class gpu-in-budget"


def test_a_later_pod_of_a_reduced_workload_stays_reduced_back_in_budget() -> None:
    decision = PriorityDecider(SETTINGS, catalog()).decide(
        {}, view("in_budget"), namespace="team-a", workload="Job/train", kept=kept_class("gpu-over-budget")
    )

    assert outcome(decision) == (PriorityRule.WORKLOAD_CLASS_KEPT, *REDUCED)


def test_a_kept_user_class_takes_the_listed_objects_numbers() -> None:
    decision = PriorityDecider(SETTINGS, catalog()).decide(
        {"priorityClassName": "high"},
        view("exhausted"),
        namespace="team-a",
        workload="Job/train",
        kept=kept_class("low"),
    )

    assert outcome(decision) == (PriorityRule.WORKLOAD_CLASS_KEPT, "low", 500, "Never")


def test_an_exempt_class_stays_exempt_in_a_workload() -> None:
    policy = PriorityDecider(SETTINGS, catalog())
    decision = policy.decide(
        {"priorityClassName": "system-node-critical"},
        view("exhausted"),
        namespace="kube-system",
        workload="Job/train",
        kept=kept_class("gpu-over-budget"),
    )

    assert decision.rule == PriorityRule.EXEMPT


def test_the_first_pod_of_a_workload_is_decided_by_the_budget() -> None:
    decision = PriorityDecider(SETTINGS, catalog()).decide(
        {}, view("exhausted"), namespace="team-a", workload="Job/train", kept=None
    )

    assert outcome(decision) == (PriorityRule.EXHAUSTED, *REDUCED)
