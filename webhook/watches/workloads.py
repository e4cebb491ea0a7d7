"""The class each workload's admitted GPU pods run at, from the pods carrying our label
(webhook.watches.kubewatch): a workload's later pods get the class of its oldest live pod, within the bounds
its first admission recorded (docs/webhook.md, "One class per workload"). Only pods a workload controller
created share a class: an ownerReference or a gang marker is the tenant's to write, the creator is not.
Needs list/watch on pods, get on the workload kinds it sizes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any, Final, Literal

from kubernetes_asyncio import client

from gpuaccounting import names
from gpuaccounting.admission_state import is_over_budget
from gpuaccounting.shares import format_share
from gpuaccounting.workloads import JOBSET_LABEL, LEADER_WORKER_SET_LABEL, Workload
from webhook.metrics import WebhookMetrics
from webhook.settings import WebhookSettings
from webhook.watches.kubewatch import ListWatch

log = logging.getLogger("webhook.workloads")

WORKLOAD_CLASS_KEPT: Final = "workload-class-kept"  # the rule id (webhook.decisions.priority.PriorityRule)
# In a kept decision's words: the pod kept its workload's class while a GPU model it can land on had its own
# budget exhausted (docs/webhook.md#model-budgets).
MODEL_EXHAUSTED_MARK: Final = "; model budget exhausted: "
# How long this replica counts a pod it admitted before its watch shows the pod (a denied one never shows).
PENDING_SECONDS: Final = 5.0
# How long a size read for a workload's first pods serves its siblings admitted before the watch shows them.
DECLARED_SECONDS: Final = 60.0
EVICTION_REASON: Final = "EvictionByEvictionAPI"  # a DisruptionTarget condition's, set before the delete

# Ours alone to write (a tenant's are dropped at admission, and /validate protects ours after it): only
# where the webhook recorded them, on a workload's pods admitted with the watch listed.
BOUND_ANNOTATIONS: Final = (
    names.ANNOTATION_WORKLOAD_SIZE,
    names.ANNOTATION_WORKLOAD_SINCE,
    names.ANNOTATION_MODELS_OFF,
)

Key = tuple[str, str]  # namespace, workload annotation (kind/name)
Role = Literal["source", "follower", "terminating", "evicted"]
# Why a pod its workload's controllers did not create keeps no class (completes "workload Job/x ...").
NOT_A_CONTROLLERS_POD: Final = "shares its class only with the pods its controllers create"

# The object that declares a workload's size, kept by the API server (a tenant may edit it, so it is read
# once, at the workload's first admission): by kind and the marker key or owner apiVersion that named it.
# Kueue's plain pod groups declare theirs on the pods only: undeclared. A ReplicaSet's and a StatefulSet's
# replicas too (issue 37): else a Deployment started with one pod in budget, scaled up once exhausted, kept
# its class for the undeclared cap's pods that never ran in budget.
_VOLCANO: Final = ("scheduling.volcano.sh", "v1beta1", "podgroups")
_COSCHEDULING: Final = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
DECLARING_OBJECTS: Final[dict[tuple[str, str], tuple[str, str, str]]] = {
    ("Job", "batch/v1"): ("batch", "v1", "jobs"),
    ("JobSet", JOBSET_LABEL): ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
    ("LeaderWorkerSet", LEADER_WORKER_SET_LABEL): ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
    ("PodGroup", "scheduling.k8s.io/group-name"): _VOLCANO,
    ("PodGroup", "scheduling.volcano.sh/group-name"): _VOLCANO,
    ("PodGroup", "pod-group-name"): ("scheduling.run.ai", "v2alpha2", "podgroups"),
    ("PodGroup", "scheduling.x-k8s.io/pod-group"): _COSCHEDULING,
    ("PodGroup", "pod-group.scheduling.sigs.k8s.io"): ("scheduling.sigs.k8s.io", "v1alpha1", "podgroups"),
    ("ReplicaSet", "apps/v1"): ("apps", "v1", "replicasets"),
    ("StatefulSet", "apps/v1"): ("apps", "v1", "statefulsets"),
}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: Any) -> int | None:
    """A count the object states, 1 where it states none (the API's default); None for a malformed one."""
    if value is None:
        return 1
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _job_pods(spec: Mapping[str, Any]) -> int | None:
    """The pods a Job runs at once: its parallelism, at most its completions. Not the completions: a
    parallelism raised later, up to them, would be pods the Job never ran while in budget."""
    parallelism, completions = _count(spec.get("parallelism")), spec.get("completions")
    if completions is None or parallelism is None:
        return parallelism
    most = _count(completions)
    return None if most is None else min(parallelism, most)


def _product(*counts: int | None) -> int | None:
    product = 1
    for count in counts:
        if count is None:
            return None
        product *= count
    return product


def declared_size(kind: str, obj: Mapping[str, Any]) -> int | None:
    """The pods a workload's object declares; None where it states no size we read."""
    spec = _mapping(obj.get("spec"))
    if kind == "Job":
        return _job_pods(spec)
    if kind == "JobSet":
        jobs = spec.get("replicatedJobs")
        sizes = [
            _product(
                _count(job.get("replicas")), _job_pods(_mapping(_mapping(job.get("template")).get("spec")))
            )
            for job in (jobs if isinstance(jobs, list) else [])
            if isinstance(job, dict)
        ]
        return None if not sizes or None in sizes else sum(size or 0 for size in sizes)
    if kind == "LeaderWorkerSet":
        template = _mapping(spec.get("leaderWorkerTemplate"))
        return _product(_count(spec.get("replicas")), _count(template.get("size")))
    if kind == "PodGroup":
        return _count(spec.get("minMember"))
    if kind in ("ReplicaSet", "StatefulSet"):
        return _count(spec.get("replicas"))
    return None


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    """The class one admitted pod of a workload runs at, the bounds its workload's first admission
    recorded on it (None on a pod admitted before they were), and, for a pod being deleted, when its grace
    period ends (its deletionTimestamp, the API server's: until then it may still run)."""

    created: datetime | None
    pod: str
    class_name: str
    priority: int | None
    preemption_policy: str | None
    size: int | None = None
    since: datetime | None = None
    deleted: datetime | None = None
    share: Fraction | None = None  # the GPU share admitted (our protected annotation)
    models_off: frozenset[str] = frozenset()  # exhausted models it could not land on (model_key spellings)

    def runs(self, now: datetime) -> bool:
        """Whether the pod may still run: not being deleted, or within its grace period."""
        return self.deleted is None or now < self.deleted


@dataclass(frozen=True, slots=True)
class Reuse:
    """What a new pod of a workload takes from its siblings: a class to keep (None: decided by the budget,
    with `refused` saying which bound stopped the reuse), and the bounds to record on it."""

    kept: WorkloadClass | None
    refused: str | None
    annotations: dict[str, str]


def _parsed_time(value: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if value else None
    except ValueError:
        return None


def parsed_models(value: str | None) -> frozenset[str]:
    """ANNOTATION_MODELS_OFF's models."""
    return frozenset(model for model in (value or "").split(",") if model)


def _parsed_size(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _parsed_share(value: str | None) -> Fraction | None:
    try:
        return Fraction(value) if value else None
    except (ValueError, ZeroDivisionError):
        return None


def _evicted(pod: client.V1Pod) -> bool:
    """Being evicted through the Eviction API (the timekeeper's `evict`, a drain): the condition is written
    before the delete, so the watch shows it before the controller can see the pod go."""
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(
        condition.type == "DisruptionTarget"
        and condition.status == "True"
        and condition.reason == EVICTION_REASON
        for condition in conditions
    )


def _entry(pod: client.V1Pod, settings: WebhookSettings) -> tuple[str, Key, WorkloadClass, Role] | None:
    """The pod's uid, workload, class and role; None for a pod our webhook did not decide (our label and
    annotations are protected: a pod without them never speaks for a workload), for one no workload
    controller created (the tenant's own pods take no class, so they neither count nor pass one on) and
    for one that has ended. A pod being deleted still runs, through a grace period the tenant sets: it
    counts until its grace period ends (WorkloadClass.runs), but passes its class on to no one."""
    metadata, spec = pod.metadata, pod.spec
    if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
        return None
    annotations = (metadata.annotations if metadata else None) or {}
    workload = annotations.get(names.ANNOTATION_WORKLOAD)
    if (
        metadata is None
        or spec is None
        or not metadata.uid
        or not settings.is_workload_controller(annotations.get(names.ANNOTATION_CREATED_BY, ""))
        or not workload
        or workload.startswith("Pod/")
        or names.ANNOTATION_PRIORITY_DECISION not in annotations
        or names.ANNOTATION_GPU_SHARE not in annotations
        or not spec.priority_class_name
    ):
        return None
    kept = WorkloadClass(
        metadata.creation_timestamp,
        metadata.name or "",
        spec.priority_class_name,
        spec.priority,
        spec.preemption_policy,
        _parsed_size(annotations.get(names.ANNOTATION_WORKLOAD_SIZE)),
        _parsed_time(annotations.get(names.ANNOTATION_WORKLOAD_SINCE)),
        metadata.deletion_timestamp,
        _parsed_share(annotations.get(names.ANNOTATION_GPU_SHARE)),
        parsed_models(annotations.get(names.ANNOTATION_MODELS_OFF)),
    )
    role: Role = (
        "evicted"
        if _evicted(pod)
        else "terminating"
        if metadata.deletion_timestamp is not None
        else "follower"
        if _inherited_while_exhausted(annotations)
        else "source"
    )
    return metadata.uid, (metadata.namespace or "", workload), kept, role


def _inherited_while_exhausted(annotations: dict[str, str]) -> bool:
    """A pod that took its workload's class while its namespace (or a GPU model it could land on) was
    exhausted passes it on to no one: were it a source, replacements of an evicted workload racing its
    eviction would keep the class it was evicted from, pass after pass. It still counts against the
    workload's size."""
    decision = annotations.get(names.ANNOTATION_PRIORITY_DECISION, "")
    return decision.startswith(f"{WORKLOAD_CLASS_KEPT}:") and (
        is_over_budget(annotations.get(names.ANNOTATION_BUDGET_STATE))  # type: ignore[arg-type]
        or MODEL_EXHAUSTED_MARK in decision
    )


def _age_order(kept: WorkloadClass) -> tuple[float, str]:
    return (kept.created.timestamp() if kept.created else float("inf"), kept.pod)


@dataclass(slots=True)
class _Pending:
    """An admission this replica answered whose pod its watch does not show yet."""

    until: float  # time.monotonic()
    claimed: bool = False  # by a re-invocation of the pod it counts (or one that looks it)


class WorkloadClasses:
    """The admitted GPU pods by workload, as last listed and watched (empty until the first list), this
    replica's admissions the watch does not show yet, and the sizes read for workloads' first pods."""

    def __init__(self, settings: WebhookSettings) -> None:
        self.settings = settings
        self._pods: dict[Key, dict[str, tuple[WorkloadClass, Role]]] = {}
        self._keys: dict[str, Key] = {}  # pod uid: its workload
        self._pending: dict[Key, list[_Pending]] = {}
        self._pruned = time.monotonic()
        self._declared: dict[Key, tuple[int | None, float]] = {}  # size read, monotonic time read
        self._reading: dict[Key, asyncio.Task[None]] = {}
        self.objects: client.CustomObjectsApi | None = None  # set with the watch: reads declared sizes
        self.loaded = False

    def replace_all(self, pods: Iterable[Any]) -> None:
        known = set(self._keys)
        self._pods, self._keys = {}, {}
        for pod in pods:
            self._put(pod, known)
        self.loaded = True

    def put(self, pod: client.V1Pod) -> None:
        self._put(pod, self._keys.keys())

    def _put(self, pod: client.V1Pod, known: Iterable[str] | set[str]) -> None:
        found = _entry(pod, self.settings)
        if found is None:
            self.remove(pod)
            return
        uid, key, kept, role = found
        if uid not in known:
            self._shown(key)
        if self._keys.get(uid, key) != key:
            self.remove(pod)
        self._keys[uid] = key
        self._pods.setdefault(key, {})[uid] = (kept, role)

    def remove(self, pod: client.V1Pod) -> None:
        uid = pod.metadata.uid if pod.metadata else None
        key = self._keys.pop(uid or "", None)
        if key is None:
            return
        siblings = self._pods.get(key, {})
        siblings.pop(uid or "", None)
        if not siblings:
            self._pods.pop(key, None)

    def _shown(self, key: Key) -> None:
        """A new pod of the workload in the watch: the oldest admission pending for it is no longer."""
        pending = self._pending.get(key)
        if pending:
            pending.pop(0)
            if not pending:
                self._pending.pop(key, None)

    def _prune(self) -> None:
        """Forget the expired admissions of every workload, at most once a pending period: those of a
        workload that never admits again (its pod denied after us) would stay."""
        now = time.monotonic()
        if now < self._pruned + PENDING_SECONDS:
            return
        self._pruned = now
        for key in list(self._pending):
            self._pending_now(key)

    def _pending_now(self, key: Key) -> list[_Pending]:
        now = time.monotonic()
        pending = [entry for entry in self._pending.get(key, []) if entry.until > now]
        if pending:
            self._pending[key] = pending
        else:
            self._pending.pop(key, None)
        return pending

    def class_of(self, namespace: str, workload: str) -> WorkloadClass | None:
        """The class of the workload's oldest pod still in the cluster that may pass it on; None for a new
        workload."""
        sources = [
            kept for kept, role in self._pods.get((namespace, workload), {}).values() if role == "source"
        ]
        return min(sources, key=_age_order) if sources else None

    def known(self) -> int:
        """How many admitted pods are known; -1 before the first list."""
        return len(self._keys) if self.loaded else -1

    def _size(self, key: Key, source: WorkloadClass | None) -> int:
        """The pods the workload may keep its class for: as its first admission recorded them, else as read
        for its first pods, else the cap for a workload whose size we do not read."""
        if source is not None:
            size = source.size
        else:
            read = self._declared.get(key)
            size = read[0] if read is not None and time.monotonic() - read[1] < DECLARED_SECONDS else None
        if size is None:
            size = self.settings.workload_class_undeclared_pods
        return min(size, self.settings.workload_class_max_pods)

    def _refusal(
        self, key: Key, source: WorkloadClass, now: datetime, pending: int, share: Fraction
    ) -> str | None:
        """Which bound stops `source`'s class from passing to one more pod asking `share`, with `pending`
        admissions the watch does not show yet; None within them all. The size counts pods, so a pod may
        ask no more than the largest of the pods that pass this class on: else a template raised once
        exhausted (a ReplicaSet's is mutable) kept the class for more GPUs than the workload ran at it (a
        larger pod already refused it runs at another class, and speaks for none but that one)."""
        siblings = self._pods.get(key, {})
        if any(role == "evicted" for _, role in siblings.values()):
            return "is being evicted"
        largest = max(
            (
                kept.share or 0
                for kept, role in siblings.values()
                if role == "source" and kept.class_name == source.class_name
            ),
            default=0,
        )
        if share > largest:
            return f"ran no pod asking a GPU share as large as {format_share(share)}"
        since = source.since or source.created
        age = self.settings.workload_class_max_age_seconds
        if since is not None and now - since > timedelta(seconds=age):
            return f"was first admitted more than {age:g} s ago"
        size = self._size(key, source)
        if sum(role != "evicted" and kept.runs(now) for kept, role in siblings.values()) + pending >= size:
            return f"has as many pods as it declared ({size})"
        return None

    def admit(
        self,
        namespace: str,
        workload: Workload,
        now: datetime,
        *,
        creator: str,
        share: Fraction,
        arrived_decided: bool,
        dry_run: bool,
    ) -> Reuse:
        """What a new pod of `workload`, created by the user `creator` and asking `share`, takes from its
        siblings, counted (unless `dry_run`) until the watch shows it. A pod no workload controller created
        takes nothing, records no bounds and is not counted: its ownerReference and markers are the
        tenant's to write.
        `arrived_decided`: the pod arrives with a decision of ours, as a re-invocation does (or a tenant's
        copy of one): it claims one admission pending for the workload rather than counting twice, so each
        admission counted excuses at most one more pod, and only until the watch shows it."""
        if workload.is_bare_pod or not self.loaded:  # before the first list (or with no watch): alone
            return Reuse(None, None, {})
        self._prune()
        key = (namespace, workload.annotation)
        source = self.class_of(*key)
        member = self.settings.is_workload_controller(creator)
        pending = self._pending_now(key)
        claimed = (
            next((entry for entry in pending if not entry.claimed), None)
            if arrived_decided and member
            else None
        )
        others = len(pending) - (claimed is not None)  # a re-invoked pod does not count itself
        refused = None if source is None else self._refusal(key, source, now, others, share)
        if source is not None and refused is None and not member:
            refused = NOT_A_CONTROLLERS_POD
        kept = source if source is not None and refused is None else None
        since = kept.since or kept.created if kept is not None else None
        annotations = {
            names.ANNOTATION_WORKLOAD_SIZE: str(self._size(key, source)),
            names.ANNOTATION_WORKLOAD_SINCE: (since or now).isoformat(timespec="seconds"),
        }
        if not dry_run:
            if refused is not None:  # a tenant's pods claiming a workload past its bounds show here
                log.info(
                    "workload_class_refused",
                    extra={
                        "namespace": namespace,
                        "workload": workload.annotation,
                        "bound": refused,
                        "creator": creator,
                    },
                )
            if claimed is not None:
                claimed.claimed = True
            elif member:
                self._pending.setdefault(key, []).append(_Pending(time.monotonic() + PENDING_SECONDS))
        return Reuse(kept, refused, annotations if member else {})

    async def prepare(self, namespace: str, workload: Workload, creator: str) -> None:
        """Before a workload's first pod is decided, read the size its object declares (one GET, short
        timeout, shared by the siblings admitted meanwhile); its later pods carry the size recorded. Not
        for a pod `creator` made that no controller did: it records no size."""
        key = (namespace, workload.annotation)
        target = DECLARING_OBJECTS.get((workload.kind, workload.via))
        # Nothing to read (a bare pod, an undeclared kind, no watch, a tenant's own pod), or a pod of the
        # workload carries its size already.
        if (
            target is None
            or self.objects is None
            or not self.settings.is_workload_controller(creator)
            or self.class_of(*key) is not None
        ):
            return
        read = self._declared.get(key)
        if read is not None and time.monotonic() - read[1] < DECLARED_SECONDS:
            return
        task = self._reading.get(key)
        if task is None:
            task = self._reading[key] = asyncio.create_task(
                self._read(self.objects, namespace, workload, target)
            )
            task.add_done_callback(lambda _: self._reading.pop(key, None))
        await asyncio.shield(task)

    async def _read(
        self,
        objects: client.CustomObjectsApi,
        namespace: str,
        workload: Workload,
        target: tuple[str, str, str],
    ) -> None:
        now = time.monotonic()
        self._declared = {
            key: read for key, read in self._declared.items() if now - read[1] < DECLARED_SECONDS
        }
        group, version, plural = target
        size = None
        try:
            obj = await objects.get_namespaced_custom_object(
                group,
                version,
                namespace,
                plural,
                workload.name,
                _request_timeout=self.settings.workload_fetch_timeout_seconds,
            )
        except Exception as error:  # absent, not served, forbidden, a timeout: the undeclared cap
            log.info(
                "workload_size_unread",
                extra={"namespace": namespace, "workload": workload.annotation, "error": str(error)},
            )
        else:
            size = declared_size(workload.kind, _mapping(obj))
        self._declared[(namespace, workload.annotation)] = (size, time.monotonic())


def workload_pod_watch(
    kube: client.ApiClient, classes: WorkloadClasses, metrics: WebhookMetrics, settings: WebhookSettings
) -> ListWatch:
    """The list and watch of the pods carrying our label that keep `classes` current; also gives `classes`
    the client it reads declared sizes with."""

    def apply(kind: str, pod: client.V1Pod) -> None:
        if kind == "DELETED":
            classes.remove(pod)
        else:
            classes.put(pod)

    classes.objects = client.CustomObjectsApi(kube)
    return ListWatch(
        "workload_pods",
        client.CoreV1Api(kube).list_pod_for_all_namespaces,
        classes.replace_all,
        apply,
        metrics.workload_pod_watch_errors,
        settings,
        selector=f"{names.LABEL_GPU_POD}=true",
    )
