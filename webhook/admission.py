"""The admission decisions over parsed requests: `/mutate` (priority and injection) and `/validate`.

Nothing here waits on the network: the budget state is read from the in-memory cache. dryRun requests
get the same answer as real ones but leave no trace in the decision metrics or logs.
"""

from __future__ import annotations

import logging
from typing import Any

from gpuaccounting import names
from gpuaccounting.shares import PodShare, Violation, format_share, read_pod
from webhook import governance
from webhook.injection import SidecarTemplate
from webhook.metrics import WebhookMetrics
from webhook.patch import diff
from webhook.priority import DecisionRecorder, PriorityPolicy
from webhook.priorityclasses import PriorityClassCatalog
from webhook.review import AdmissionDenied, AdmissionRequest, build_response
from webhook.settings import WebhookSettings
from webhook.state import BudgetStateCache

log = logging.getLogger("webhook.admission")


MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"


def _is_mirror(pod: dict[str, Any]) -> bool:
    """A kubelet's static pod: it runs whatever we answer, and may not carry ServiceAccount tokens."""
    return MIRROR_POD_ANNOTATION in ((pod.get("metadata") or {}).get("annotations") or {})


def _describe_pod(request: AdmissionRequest, pod: dict[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    name = request.name or metadata.get("name") or f"{metadata.get('generateName', '')}<generated>"
    return f"pod {name} in namespace {request.namespace or metadata.get('namespace', '')}"


class Admission:
    def __init__(
        self,
        settings: WebhookSettings,
        cache: BudgetStateCache,
        metrics: WebhookMetrics,
        priority_classes: PriorityClassCatalog,
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.metrics = metrics
        self.hardware = settings.hardware
        self.sidecar = SidecarTemplate(settings)
        self.priority = PriorityPolicy(settings, priority_classes)
        self.decisions = DecisionRecorder(metrics)

    def read(self, pod: dict[str, Any]) -> PodShare:
        return read_pod(pod, self.hardware, skip_container=names.SIDECAR_CONTAINER_NAME)

    def _namespace(self, request: AdmissionRequest, pod: dict[str, Any]) -> str:
        return request.namespace or (pod.get("metadata") or {}).get("namespace", "")

    def mutate(self, request: AdmissionRequest) -> tuple[bytes, str]:
        """The answer and the result label; only a Pod CREATE of a GPU pod is ever changed."""
        pod = request.object
        if (
            not request.is_pod
            or request.operation != "CREATE"
            or request.subresource
            or pod is None
            or _is_mirror(pod)
        ):
            return build_response(request), "skipped"
        share = self.read(pod)
        if not share.uses_gpu:
            return build_response(request), "non_gpu"
        metadata = dict(pod.get("metadata") or {})
        spec = dict(pod.get("spec") or {})
        annotations = metadata.get("annotations") or {}
        view = self.cache.view(self._namespace(request, pod))
        decision = self.priority.decide(spec, view, annotations.get(names.ANNOTATION_PRIORITY_DECISION))
        if not request.dry_run:
            self.decisions.record(decision)
        decision.apply(spec)
        share_text = format_share(share.share)
        metadata["annotations"] = {
            **annotations,
            names.ANNOTATION_GPU_SHARE: share_text,
            names.ANNOTATION_SHARING_SYSTEM: str(share.system),
            names.ANNOTATION_BUDGET_STATE: decision.budget_state or "unknown",
            names.ANNOTATION_PRIORITY_DECISION: decision.annotation,
            names.ANNOTATION_INJECTED: self.settings.sidecar_image,
        }
        self.sidecar.inject(spec, share_text)
        patch = diff(pod, {**pod, "metadata": metadata, "spec": spec})
        return build_response(request, patch=patch), "patched" if patch else "unchanged"

    def violations(self, request: AdmissionRequest) -> list[Violation]:
        pod = request.object
        if (
            not request.is_pod
            or pod is None
            or request.operation not in ("CREATE", "UPDATE")
            or _is_mirror(pod)
        ):
            return []
        if request.subresource == "ephemeralcontainers":
            return governance.token_mounts(pod)
        if request.subresource:
            return []
        if request.operation == "UPDATE":
            return governance.on_update(request, self.settings)
        share = self.read(pod)
        view = self.cache.view(self._namespace(request, pod))
        return governance.on_create(pod, share, view, self.settings)

    def validate(self, request: AdmissionRequest) -> tuple[bytes, str]:
        found = self.violations(request)
        if not found:
            return build_response(request), "allowed"
        denials = [v.describe() for v in found if self.settings.enforces(v.rule)]
        warnings = [v.describe() for v in found if not self.settings.enforces(v.rule)]
        if not denials:
            return build_response(request, warnings=warnings), "warned"
        message = f"{_describe_pod(request, request.object or {})}: " + "; ".join(denials)
        if not request.dry_run:
            log.info(
                "admission_denied",
                extra={
                    "namespace": request.namespace,
                    "pod": request.name or (request.object or {}).get("metadata", {}).get("generateName", ""),
                    "operation": request.operation,
                    "rules": sorted({v.rule for v in found if self.settings.enforces(v.rule)}),
                },
            )
        return build_response(request, denied=AdmissionDenied(message), warnings=warnings), "denied"
