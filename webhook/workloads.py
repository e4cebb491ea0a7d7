"""The class each workload's admitted GPU pods run at, from the pods carrying our label (webhook.kubewatch):
a workload's later pods get the class of its oldest live pod. Needs list/watch on pods cluster-wide."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from kubernetes_asyncio import client

from gpuaccounting import names
from gpuaccounting.admission_state import is_over_budget
from webhook.kubewatch import ListWatch
from webhook.metrics import WebhookMetrics
from webhook.settings import WebhookSettings

WORKLOAD_CLASS_KEPT: Final = "workload-class-kept"  # the rule id (webhook.priority.PriorityRule)

Key = tuple[str, str]  # namespace, workload annotation (kind/name)


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    """The class one admitted pod of a workload runs at."""

    created: datetime | None
    pod: str
    class_name: str
    priority: int | None
    preemption_policy: str | None


def _entry(pod: client.V1Pod) -> tuple[str, Key, WorkloadClass] | None:
    """The pod's uid, workload and class; None for a pod our webhook did not decide (labels are the
    tenant's, our annotations are protected: a pod without them never speaks for a workload) and for one
    that has ended or is going (an evicted workload's new pods are decided afresh)."""
    metadata, spec = pod.metadata, pod.spec
    if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
        return None
    annotations = (metadata.annotations if metadata else None) or {}
    workload = annotations.get(names.ANNOTATION_WORKLOAD)
    if (
        metadata is None
        or spec is None
        or not metadata.uid
        or metadata.deletion_timestamp is not None
        or not workload
        or workload.startswith("Pod/")
        or names.ANNOTATION_PRIORITY_DECISION not in annotations
        or names.ANNOTATION_GPU_SHARE not in annotations
        or not spec.priority_class_name
        or _inherited_while_exhausted(annotations)
    ):
        return None
    kept = WorkloadClass(
        metadata.creation_timestamp,
        metadata.name or "",
        spec.priority_class_name,
        spec.priority,
        spec.preemption_policy,
    )
    return metadata.uid, (metadata.namespace or "", workload), kept


def _inherited_while_exhausted(annotations: dict[str, str]) -> bool:
    """A pod that took its workload's class while its namespace was exhausted passes it on to no one:
    were it a source, replacements of an evicted workload racing its eviction would keep the class it was
    evicted from, pass after pass."""
    decision = annotations.get(names.ANNOTATION_PRIORITY_DECISION, "")
    return decision.startswith(f"{WORKLOAD_CLASS_KEPT}:") and is_over_budget(
        annotations.get(names.ANNOTATION_BUDGET_STATE)  # type: ignore[arg-type]
    )


def _age_order(kept: WorkloadClass) -> tuple[float, str]:
    return (kept.created.timestamp() if kept.created else float("inf"), kept.pod)


class WorkloadClasses:
    """The admitted GPU pods by workload, as last listed and watched; empty until the first list."""

    def __init__(self) -> None:
        self._pods: dict[Key, dict[str, WorkloadClass]] = {}
        self._keys: dict[str, Key] = {}  # pod uid: its workload
        self.loaded = False

    def replace_all(self, pods: Iterable[Any]) -> None:
        self._pods, self._keys = {}, {}
        for pod in pods:
            self.put(pod)
        self.loaded = True

    def put(self, pod: client.V1Pod) -> None:
        found = _entry(pod)
        if found is None:
            self.remove(pod)
            return
        uid, key, kept = found
        if self._keys.get(uid, key) != key:
            self.remove(pod)
        self._keys[uid] = key
        self._pods.setdefault(key, {})[uid] = kept

    def remove(self, pod: client.V1Pod) -> None:
        uid = pod.metadata.uid if pod.metadata else None
        key = self._keys.pop(uid or "", None)
        if key is None:
            return
        siblings = self._pods.get(key, {})
        siblings.pop(uid or "", None)
        if not siblings:
            self._pods.pop(key, None)

    def class_of(self, namespace: str, workload: str) -> WorkloadClass | None:
        """The class of the workload's oldest pod still in the cluster; None for a new workload."""
        siblings = self._pods.get((namespace, workload))
        return min(siblings.values(), key=_age_order) if siblings else None

    def known(self) -> int:
        """How many admitted pods are known; -1 before the first list."""
        return len(self._keys) if self.loaded else -1


def workload_pod_watch(
    api: client.CoreV1Api, classes: WorkloadClasses, metrics: WebhookMetrics, settings: WebhookSettings
) -> ListWatch:
    """The list and watch of the pods carrying our label that keep `classes` current."""

    def apply(kind: str, pod: client.V1Pod) -> None:
        if kind == "DELETED":
            classes.remove(pod)
        else:
            classes.put(pod)

    return ListWatch(
        "workload_pods",
        api.list_pod_for_all_namespaces,
        classes.replace_all,
        apply,
        metrics.workload_pod_watch_errors,
        settings,
        selector=f"{names.LABEL_GPU_POD}=true",
    )
