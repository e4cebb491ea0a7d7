"""Where gang schedulers read a workload's priority, kept to what GPU pods are given (docs/webhook.md,
"Gang schedulers"), so that no one keeps a higher class through the group or its owner:

- KAI-Scheduler's podgrouper takes the `priorityClassName` label of the pod's top owner, else the pod's
  label, else the pod's class. A GPU owner's label is removed (an exempt class stays): the pods, whose
  class is decided when they are admitted, speak for it; a GPU pod's label is set to its class.
- Volcano takes its PodGroup's `spec.priorityClassName`: a GPU group's is decided as a GPU pod's class.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpuaccounting import names
from gpuaccounting.shares import GpuHardware, Rule, Violation, read_pod
from gpuaccounting.workloads import Workload
from webhook.patch import diff
from webhook.priority import PriorityPolicy, PriorityRule
from webhook.review import AdmissionRequest, AdmissionResponse
from webhook.state import BudgetStateCache
from webhook.workloads import WorkloadClasses

KAI_PRIORITY_LABEL: Final = "priorityClassName"  # KAI-Scheduler's podgrouper (constants.PriorityLabelKey)
VOLCANO_GROUP: Final = ("scheduling.volcano.sh", "PodGroup")
MAX_DEPTH: Final = 12  # how deep pod templates are looked for: deeper than workload kinds nest them

UNCHANGED: Final = AdmissionResponse("unchanged")


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def pod_templates(obj: Any, depth: int = 0) -> Iterator[Mapping[str, Any]]:
    """The pod templates an object embeds at any depth: a Job's, each of a JobSet's or PyTorchJob's."""
    if depth > MAX_DEPTH:
        return
    if isinstance(obj, dict):
        if isinstance(obj.get("spec"), dict) and isinstance(obj["spec"].get("containers"), list):
            yield obj
            return
        for value in obj.values():
            yield from pod_templates(value, depth + 1)
    elif isinstance(obj, list):
        for item in obj:
            yield from pod_templates(item, depth + 1)


def pod_label(labels: dict[str, Any], class_name: str | None) -> dict[str, Any]:
    """A GPU pod's labels with KAI's priority label, where the tenant set one, naming the pod's class."""
    if KAI_PRIORITY_LABEL in labels and class_name:
        return {**labels, KAI_PRIORITY_LABEL: class_name}
    return labels


def pod_label_violation(old: Mapping[str, Any], new: Mapping[str, Any]) -> Violation | None:
    """A change to a decided GPU pod's KAI label that names another class than the pod's."""
    old_metadata, metadata = _mapping(old.get("metadata")), _mapping(new.get("metadata"))
    label = _mapping(metadata.get("labels")).get(KAI_PRIORITY_LABEL)
    decided = names.ANNOTATION_PRIORITY_DECISION in _mapping(old_metadata.get("annotations"))
    class_name = _mapping(new.get("spec")).get("priorityClassName")
    if not decided or label is None or label == class_name:
        return None
    if label == _mapping(old_metadata.get("labels")).get(KAI_PRIORITY_LABEL):
        return None  # unchanged: not this update's doing
    return Violation(
        Rule.PROTECTED_ANNOTATIONS,
        f"names the class gang schedulers read, and may only name the pod's own ({class_name})",
        resource=f"label {KAI_PRIORITY_LABEL}",
        value=repr(label),
    )


@dataclass(frozen=True, slots=True)
class Gangs:
    """The mutation of the objects gang schedulers read a workload's priority from (not pods)."""

    hardware: GpuHardware
    cache: BudgetStateCache
    priority: PriorityPolicy
    workloads: WorkloadClasses

    def _uses_gpu(self, pod: Mapping[str, Any]) -> bool:
        return read_pod(pod, self.hardware).uses_gpu

    def mutate(self, request: AdmissionRequest) -> AdmissionResponse:
        obj = request.object
        if request.operation not in ("CREATE", "UPDATE") or request.subresource or not isinstance(obj, dict):
            return UNCHANGED
        namespace = request.namespace or _mapping(obj.get("metadata")).get("namespace") or ""
        if (request.kind.group, request.kind.kind) == VOLCANO_GROUP:
            mutated, warning = self._volcano_group(obj, namespace, request.name)
        else:
            mutated, warning = self._owner(obj, namespace)
        patch = diff(obj, mutated)
        if not patch:
            return UNCHANGED
        return AdmissionResponse("patched", patch=tuple(patch), warnings=(warning,) if warning else ())

    def _volcano_group(
        self, group: dict[str, Any], namespace: str, name: str | None
    ) -> tuple[dict[str, Any], str]:
        metadata = dict(_mapping(group.get("metadata")))
        spec = dict(_mapping(group.get("spec")))
        workload = Workload("PodGroup", str(metadata.get("name") or name or "")).annotation
        kept = self.workloads.class_of(namespace, workload)
        asked = _mapping(spec.get("minResources"))
        resources = {"containers": [{"name": "group", "resources": {"requests": dict(asked)}}]}
        if kept is None and not self._uses_gpu({"spec": resources}):
            return group, ""  # not known to be a GPU gang: its class is not ours to decide
        annotations = dict(_mapping(metadata.get("annotations")))
        arrived = spec.get("priorityClassName") or None
        decided = {"priorityClassName": arrived} if arrived else {}
        previous = annotations.get(names.ANNOTATION_PRIORITY_DECISION)
        view = self.cache.view(namespace)
        decision = self.priority.decide(
            decided, view, previous, namespace=namespace, workload=workload, kept=kept
        )
        decision.apply(decided)
        class_name = decided.get("priorityClassName")
        if class_name:
            spec["priorityClassName"] = class_name
        annotations[names.ANNOTATION_PRIORITY_DECISION] = decision.annotation
        metadata["annotations"] = annotations
        changed = f"spec.priorityClassName set to {class_name} by gpu-timekeeper"
        return {**group, "metadata": metadata, "spec": spec}, changed if class_name != arrived else ""

    def _owner(self, owner: dict[str, Any], namespace: str) -> tuple[dict[str, Any], str]:
        metadata = dict(_mapping(owner.get("metadata")))
        labels = dict(_mapping(metadata.get("labels")))
        arrived = labels.get(KAI_PRIORITY_LABEL)
        templates = pod_templates(owner.get("spec"))
        if arrived is None or not any(self._uses_gpu(template) for template in templates):
            return owner, ""
        decision = self.priority.decide(
            {"priorityClassName": arrived}, self.cache.view(namespace), namespace=namespace
        )
        if decision.rule == PriorityRule.EXEMPT:
            return owner, ""
        del labels[KAI_PRIORITY_LABEL]
        metadata["labels"] = labels
        warning = (
            f"label {KAI_PRIORITY_LABEL} removed by gpu-timekeeper: a GPU workload's class is the one"
            " its pods are given"
        )
        return {**owner, "metadata": metadata}, warning
