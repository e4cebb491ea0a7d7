"""The cluster's PriorityClasses, watched (webhook.watches.kubewatch): whether a pod's class came from the
`globalDefault` or its user, and each class's real `value` and `preemptionPolicy` (docs/webhook.md, "The
PriorityClass watch"). Needs get/list/watch on priorityclasses.scheduling.k8s.io."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kubernetes_asyncio import client

from webhook.metrics import WebhookMetrics
from webhook.settings import WebhookSettings
from webhook.watches.kubewatch import ListWatch

DEFAULT_PREEMPTION_POLICY = "PreemptLowerPriority"  # what the API server defaults an unset field to


@dataclass(frozen=True, slots=True)
class PriorityClassInfo:
    name: str
    value: int
    preemption_policy: str
    global_default: bool

    @classmethod
    def from_object(cls, obj: client.V1PriorityClass) -> PriorityClassInfo:
        return cls(
            name=obj.metadata.name,
            value=int(obj.value),
            preemption_policy=obj.preemption_policy or DEFAULT_PREEMPTION_POLICY,
            global_default=bool(obj.global_default),
        )


class PriorityClassCatalog:
    """The classes as last listed and watched; empty and not `loaded` until the first list."""

    def __init__(self) -> None:
        self._classes: dict[str, PriorityClassInfo] = {}
        self.loaded = False

    def replace_all(self, classes: Iterable[PriorityClassInfo]) -> None:
        self._classes = {info.name: info for info in classes}
        self.loaded = True

    def put(self, info: PriorityClassInfo) -> None:
        self._classes[info.name] = info

    def remove(self, name: str) -> None:
        self._classes.pop(name, None)

    def get(self, name: str) -> PriorityClassInfo | None:
        return self._classes.get(name)

    def is_global_default(self, name: str) -> bool:
        info = self._classes.get(name)
        return info is not None and info.global_default

    def known(self) -> int:
        """How many classes are known; -1 before the first list (the metric's value)."""
        return len(self._classes) if self.loaded else -1


def priority_class_watch(
    api: client.SchedulingV1Api,
    catalog: PriorityClassCatalog,
    metrics: WebhookMetrics,
    settings: WebhookSettings,
) -> ListWatch:
    """The list and watch that keep `catalog` current."""

    def apply(kind: str, obj: client.V1PriorityClass) -> None:
        info = PriorityClassInfo.from_object(obj)
        if kind == "DELETED":
            catalog.remove(info.name)
        else:
            catalog.put(info)

    return ListWatch(
        "priority_classes",
        api.list_priority_class,
        lambda items: catalog.replace_all(PriorityClassInfo.from_object(item) for item in items),
        apply,
        metrics.priority_class_watch_errors,
        settings,
    )
