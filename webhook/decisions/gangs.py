"""Where gang schedulers read a workload's priority, kept at or below what GPU pods are given
(docs/webhook.md, "Gang schedulers"), so that no one keeps a higher class through the group or its owner:

- KAI-Scheduler's podgrouper takes the `priorityClassName` label of the pod's top owner, else the pod's
  label, else the pod's class. A GPU owner's label naming a class above the reduced one is removed (an
  exempt class stays); a GPU pod whose label names a class above its own is refused (changing a pod's
  labels could take it out of its controller's selector).
- Volcano takes its PodGroup's `spec.priorityClassName`: a GPU group's, and a GPU VolcanoJob's (which its
  job controller copies to the group), are decided as a GPU pod's class.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpuaccounting import names
from gpuaccounting.shares import GpuHardware, Rule, Violation, read_pod
from gpuaccounting.workloads import Workload
from webhook.decisions.answer import AdmissionResponse
from webhook.decisions.priority import PriorityDecider, PriorityRule
from webhook.reviews.patch import diff
from webhook.reviews.review import AdmissionRequest
from webhook.watches.budgetcache import BudgetStateCache
from webhook.watches.workloads import WorkloadClass, WorkloadClasses

KAI_PRIORITY_LABEL: Final = "priorityClassName"  # KAI-Scheduler's podgrouper (constants.PriorityLabelKey)
VOLCANO_GROUP: Final = ("scheduling.volcano.sh", "PodGroup")
# Volcano's job controller creates the job's PodGroup with the job's class and keeps it in step: a
# VolcanoJob's class is decided alike, so the controller and the webhook agree on the group's.
VOLCANO_JOB: Final = ("batch.volcano.sh", "Job")
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


@dataclass(frozen=True, slots=True)
class Gangs:
    """The mutation of the objects gang schedulers read a workload's priority from (not pods)."""

    hardware: GpuHardware
    cache: BudgetStateCache
    priority: PriorityDecider
    workloads: WorkloadClasses

    def _uses_gpu(self, pod: Mapping[str, Any]) -> bool:
        return read_pod(pod, self.hardware).uses_gpu

    def _value(self, class_name: str) -> int | None:
        """A class's value: ours from the settings or the object, another's once the watch listed it."""
        for ours in (self.priority.in_budget_class(), self.priority.reduced_class()):
            if ours.name == class_name:
                return ours.value
        info = self.priority.catalog.get(class_name)
        return None if info is None else info.value

    def _above(self, class_name: str, ceiling: int | None) -> bool:
        """Whether `class_name` may be above `ceiling` (a class of unknown value may)."""
        value = self._value(class_name)
        return value is None or ceiling is None or value > ceiling

    def pod_label_violation(self, request: AdmissionRequest) -> Violation | None:
        """A GPU pod of ours whose KAI label names a class above its own, set by this request."""
        new, old = request.object or {}, request.old_object or {}
        metadata = _mapping(new.get("metadata"))
        decided = (old or new).get("metadata") or {}
        label = _mapping(metadata.get("labels")).get(KAI_PRIORITY_LABEL)
        spec = _mapping(new.get("spec"))
        class_name = spec.get("priorityClassName")
        if names.ANNOTATION_PRIORITY_DECISION not in _mapping(_mapping(decided).get("annotations")):
            return None
        if label is None or label == class_name:
            return None
        if old and label == _mapping(_mapping(old.get("metadata")).get("labels")).get(KAI_PRIORITY_LABEL):
            return None  # unchanged: not this update's doing
        own = spec.get("priority")
        if not self._above(str(label), own if isinstance(own, int) else None):
            return None
        return Violation(
            Rule.PROTECTED_ANNOTATIONS,
            f"is the class KAI-Scheduler reads for the gang, and may not name one above the pod's own"
            f" ({class_name}): remove it from the pod (template)",
            resource=f"label {KAI_PRIORITY_LABEL}",
            value=repr(label),
        )

    def mutate(self, request: AdmissionRequest) -> AdmissionResponse:
        obj = request.object
        if request.operation not in ("CREATE", "UPDATE") or request.subresource or not isinstance(obj, dict):
            return UNCHANGED
        namespace = request.namespace or _mapping(obj.get("metadata")).get("namespace") or ""
        kind = (request.kind.group, request.kind.kind)
        if kind == VOLCANO_GROUP:
            mutated, warning = self._volcano_group(obj, namespace, request.name)
        elif kind == VOLCANO_JOB:
            mutated, warning = self._volcano_job(obj, namespace)
        else:
            mutated, warning = self._owner(obj, namespace)
        patch = diff(obj, mutated)
        if not patch:
            return UNCHANGED
        return AdmissionResponse("patched", patch=tuple(patch), warnings=(warning,) if warning else ())

    def _volcano_group(
        self, group: dict[str, Any], namespace: str, name: str | None
    ) -> tuple[dict[str, Any], str]:
        metadata = _mapping(group.get("metadata"))
        workload = Workload("PodGroup", str(metadata.get("name") or name or "")).annotation
        kept = self.workloads.class_of(namespace, workload)
        asked = _mapping(_mapping(group.get("spec")).get("minResources"))
        resources = {"containers": [{"name": "group", "resources": {"requests": dict(asked)}}]}
        if kept is None and not self._uses_gpu({"spec": resources}):
            return group, ""  # not known to be a GPU gang: its class is not ours to decide
        return self._decided(group, namespace, workload, kept)

    def _volcano_job(self, job: dict[str, Any], namespace: str) -> tuple[dict[str, Any], str]:
        metadata = _mapping(job.get("metadata"))
        # The group Volcano's job controller makes is named `<job>-<uid>` (known from the job's UPDATE).
        group = f"{metadata.get('name')}-{metadata.get('uid')}" if metadata.get("uid") else ""
        workload = Workload("PodGroup", group).annotation if group else ""
        kept = self.workloads.class_of(namespace, workload) if group else None
        if kept is None and not any(self._uses_gpu(t) for t in pod_templates(job.get("spec"))):
            return job, ""
        return self._decided(job, namespace, workload, kept)

    def _decided(
        self, obj: dict[str, Any], namespace: str, workload: str, kept: WorkloadClass | None
    ) -> tuple[dict[str, Any], str]:
        """`obj` with its `spec.priorityClassName` decided as a GPU pod's class, and the decision."""
        metadata = dict(_mapping(obj.get("metadata")))
        spec = dict(_mapping(obj.get("spec")))
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
        return {**obj, "metadata": metadata, "spec": spec}, changed if class_name != arrived else ""

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
        # At or below the reduced class it is never above what the pods get, in any state.
        if decision.rule == PriorityRule.EXEMPT or not self._above(
            arrived, self.priority.reduced_class().value
        ):
            return owner, ""
        del labels[KAI_PRIORITY_LABEL]
        metadata["labels"] = labels
        warning = (
            f"label {KAI_PRIORITY_LABEL} ({arrived}) removed by gpu-timekeeper: a GPU workload's class is"
            " the one its pods are given"
        )
        return {**owner, "metadata": metadata}, warning
