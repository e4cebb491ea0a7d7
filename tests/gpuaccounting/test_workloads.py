"""A pod's workload: its gang marker first, then the controller that stamps its name on every pod, then its
controlling owner; a bare pod is its own. Whatever the pod carries is input: malformed markers are ignored."""

from __future__ import annotations

from typing import Any

import pytest

from gpuaccounting.workloads import MAX_NAME_LENGTH, Workload, workload_of


def pod(
    annotations: dict[str, Any] | None = None,
    labels: dict[str, Any] | None = None,
    owners: list[Any] | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"annotations": annotations or {}, "labels": labels or {}}
    if owners is not None:
        metadata["ownerReferences"] = owners
    if name is not None:
        metadata["name"] = name
    return {"metadata": metadata, "spec": {}}


def owner(kind: str, name: str, controller: Any = True) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": kind, "name": name, "uid": "u", "controller": controller}


JOB = owner("Job", "train")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (pod(owners=[JOB]), Workload("Job", "train")),
        (pod(owners=[owner("ReplicaSet", "web-5d9c")]), Workload("ReplicaSet", "web-5d9c")),
        (pod(labels={"jobset.sigs.k8s.io/jobset-name": "js"}, owners=[JOB]), Workload("JobSet", "js")),
        (
            pod(labels={"leaderworkerset.sigs.k8s.io/name": "llm"}, owners=[owner("StatefulSet", "llm-0")]),
            Workload("LeaderWorkerSet", "llm"),
        ),
        (pod(annotations={"scheduling.k8s.io/group-name": "pg"}, owners=[JOB]), Workload("PodGroup", "pg")),
        (pod(annotations={"scheduling.volcano.sh/group-name": "vg"}), Workload("PodGroup", "vg")),
        (pod(annotations={"pod-group-name": "kai-pg"}, owners=[JOB]), Workload("PodGroup", "kai-pg")),
        (pod(labels={"scheduling.x-k8s.io/pod-group": "co"}), Workload("PodGroup", "co")),
        (pod(labels={"pod-group.scheduling.sigs.k8s.io": "old"}), Workload("PodGroup", "old")),
        (pod(labels={"kueue.x-k8s.io/pod-group-name": "kq"}), Workload("PodGroup", "kq")),
        (pod(name="alone"), Workload("Pod", "alone")),
    ],
)
def test_the_workload_is_the_most_specific_marker(given: dict[str, Any], expected: Workload) -> None:
    assert workload_of(given) == expected


def test_a_gang_marker_wins_over_the_jobset_that_created_the_pod() -> None:
    given = pod(
        annotations={"pod-group-name": "gang"}, labels={"jobset.sigs.k8s.io/jobset-name": "js"}, owners=[JOB]
    )

    assert workload_of(given) == Workload("PodGroup", "gang")


def test_only_the_controlling_owner_counts() -> None:
    given = pod(owners=[owner("ConfigMap", "keeper", controller=False), JOB], name="p")

    assert workload_of(given) == Workload("Job", "train")
    assert workload_of(pod(owners=[owner("Job", "x", controller="true")], name="p")) == Workload("Pod", "p")


def test_a_bare_pod_created_with_generate_name_takes_the_name_given_to_it() -> None:
    assert workload_of(pod(), "given-abcde") == Workload("Pod", "given-abcde")
    assert workload_of(pod()).is_bare_pod


@pytest.mark.parametrize(
    "bad",
    [None, "", 7, ["x"], {"a": 1}, "x" * (MAX_NAME_LENGTH + 1)],
)
def test_a_malformed_marker_or_owner_is_ignored(bad: Any) -> None:
    given = pod(
        annotations={"scheduling.k8s.io/group-name": bad},
        labels={"jobset.sigs.k8s.io/jobset-name": bad},
        owners=[owner("Job", bad), "not an owner", None],
        name="p",
    )

    assert workload_of(given) == Workload("Pod", "p")


@pytest.mark.parametrize(
    "metadata", [None, "x", [], {"ownerReferences": "x", "labels": [], "annotations": 3}]
)
def test_malformed_metadata_is_a_bare_pod(metadata: Any) -> None:
    assert workload_of({"metadata": metadata}, "p") == Workload("Pod", "p")


def test_the_annotation_names_kind_and_name() -> None:
    assert Workload("Job", "train").annotation == "Job/train"


def test_a_workload_says_what_named_it_without_being_another_workload() -> None:
    """The webhook reads a workload's declared size from the object its marker or owner names."""
    by_owner = workload_of(pod(owners=[JOB]))
    by_marker = workload_of(pod(annotations={"pod-group-name": "pg"}))

    assert (by_owner.via, by_marker.via) == ("batch/v1", "pod-group-name")
    assert by_owner == Workload("Job", "train") and hash(by_owner) == hash(Workload("Job", "train"))
