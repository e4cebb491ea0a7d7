"""The admission decisions over parsed requests: `/mutate` (priority and injection) and `/validate`. Each
returns a typed `AdmissionResponse` and never waits on the network (the budget state is cached); dryRun,
metrics and logs are the endpoint's. Work is bounded by `max_containers` and the body limit."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

from gpuaccounting import names
from gpuaccounting.dra import read_claims, with_claims
from gpuaccounting.gpumodels import model_key
from gpuaccounting.placement import Placement, pod_models
from gpuaccounting.shares import PodShare, Violation, format_share, read_pod
from gpuaccounting.workloads import workload_of
from webhook.decisions import governance
from webhook.decisions.answer import AdmissionResponse, Denial
from webhook.decisions.gangs import Gangs
from webhook.decisions.injection import SidecarTemplate
from webhook.decisions.priority import PriorityDecider
from webhook.decisions.steering import steer
from webhook.reviews.patch import diff
from webhook.reviews.review import AdmissionRequest, PodRequest
from webhook.settings import WebhookSettings
from webhook.watches.budgetcache import BudgetStateCache, NamespaceView
from webhook.watches.dra import DraObjects, DraWatch
from webhook.watches.priorityclasses import PriorityClassCatalog
from webhook.watches.workloads import BOUND_ANNOTATIONS, WorkloadClasses

MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
# Who makes mirror pods: a kubelet, as the Node authorizer names it (`system:node:<node>`).
NODE_USERNAME_PREFIX: Final = "system:node:"
CONTAINER_CAP_RULE: Final = "max-containers"

SKIPPED: Final = AdmissionResponse("skipped")
NON_GPU: Final = AdmissionResponse("non_gpu")
ALLOWED: Final = AdmissionResponse("allowed")


def _is_mirror(request: AdmissionRequest, pod: dict[str, Any]) -> bool:
    """A kubelet's static pod: it runs whatever we answer, and may not carry ServiceAccount tokens. The
    annotation alone is anyone's to write (a tenant's pod with it and a `nodeName` is stored as asked), so
    only a node's request makes a mirror pod."""
    return request.username.startswith(NODE_USERNAME_PREFIX) and MIRROR_POD_ANNOTATION in (
        (pod.get("metadata") or {}).get("annotations") or {}
    )


def models_off(view: NamespaceView, placement: Placement | None, steered: tuple[str, ...]) -> dict[str, str]:
    """ANNOTATION_MODELS_OFF for a pod with this placement: the namespace's exhausted models it cannot land
    on (its spec's, or the steering's doing); none where none is."""
    if placement is None or view.admission is None:
        return {}
    exhausted = {model_key(model) for model in view.admission.get("exhausted_models", ())}
    off = sorted(model for model in exhausted if not placement.open_to(model) or model in steered)
    return {names.ANNOTATION_MODELS_OFF: ",".join(off)} if off else {}


def _new_pod(request: AdmissionRequest) -> dict[str, Any] | None:
    """The pod of a Pod CREATE the decisions judge; None for what is answered as it is (other kinds and
    operations, subresources, mirror pods)."""
    pod = request.object
    if not request.is_pod or request.operation != "CREATE" or request.subresource or pod is None:
        return None
    return None if _is_mirror(request, pod) else pod


def _describe_pod(request: AdmissionRequest, pod: dict[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    name = request.name or metadata.get("name") or f"{metadata.get('generateName', '')}<generated>"
    return f"pod {name} in namespace {request.namespace or metadata.get('namespace', '')}"


class Admission:
    def __init__(
        self,
        settings: WebhookSettings,
        cache: BudgetStateCache,
        priority_classes: PriorityClassCatalog,
        dra: DraObjects,
        workloads: WorkloadClasses | None = None,
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.hardware = settings.hardware
        self.sidecar = SidecarTemplate(settings)
        self.priority = PriorityDecider(settings, priority_classes)
        self.dra = dra
        self.workloads = workloads or WorkloadClasses(settings)  # filled by the lifespan pod watch
        self.gangs = Gangs(self.hardware, cache, self.priority, self.workloads)
        self.dra_watch: DraWatch | None = None  # set by the app's lifespan when it watches DRA objects

    def read(self, pod: dict[str, Any], namespace: str) -> PodShare:
        """The pod's share: its device-plugin requests, pod-level asks and DRA claims."""
        share = read_pod(pod, self.hardware, skip_container=names.SIDECAR_CONTAINER_NAME)
        claims = read_claims(pod, self.dra.specs(namespace), self.hardware, self.dra.drivers)
        return with_claims(share, claims, self.hardware)

    def placement(self, pod: dict[str, Any], namespace: str) -> Placement:
        """The GPU models the pod can land on (gpuaccounting.placement), its DRA claims' pins included."""
        models = self.hardware.models
        claims = self.dra.claim_models(namespace, pod, models)
        return pod_models(pod.get("spec") or {}, models, claims)

    async def prepare(self, request: AdmissionRequest) -> None:
        """Before a pod naming DRA claims is judged, fetch those the watch has not brought yet; before a
        workload's first pod is, read the size the workload declares."""
        pod = _new_pod(request)
        if pod is not None and self.dra_watch is not None and (pod.get("spec") or {}).get("resourceClaims"):
            await self.dra_watch.fetch_missing(self._namespace(request, pod), pod)
        if pod is not None:
            await self.workloads.prepare(
                self._namespace(request, pod), workload_of(pod, request.name), request.username
            )

    def _namespace(self, request: AdmissionRequest, pod: dict[str, Any]) -> str:
        return request.namespace or (pod.get("metadata") or {}).get("namespace", "")

    def _over_container_cap(self, request: AdmissionRequest, pod: dict[str, Any]) -> AdmissionResponse | None:
        """A denial for a new pod with more containers than any real one has; the parse did not read it.

        CREATE only: a running pod (or one being deleted) must never be stuck behind a limit set later."""
        count = request.container_count if isinstance(request, PodRequest) else 0
        if count <= self.settings.max_containers:
            return None
        message = (
            f"{_describe_pod(request, pod)}: has {count} containers (init, app and ephemeral), more than the"
            f" {self.settings.max_containers} gpu-timekeeper admits (WEBHOOK_MAX_CONTAINERS)"
        )
        return AdmissionResponse("denied", denial=Denial(message, (CONTAINER_CAP_RULE,)))

    def mutate(self, request: AdmissionRequest) -> AdmissionResponse:
        """Only a Pod CREATE of a GPU pod is ever changed, and what gang schedulers read a class from."""
        if not request.is_pod:
            return self.gangs.mutate(request)
        pod = _new_pod(request)
        if pod is None:
            return SKIPPED
        if (too_many := self._over_container_cap(request, pod)) is not None:
            return too_many
        namespace = self._namespace(request, pod)
        share = self.read(pod, namespace)
        if not share.uses_gpu:
            return NON_GPU
        metadata = dict(pod.get("metadata") or {})
        spec = dict(pod.get("spec") or {})
        annotations = metadata.get("annotations") or {}
        view = self.cache.view(namespace)
        previous = annotations.get(names.ANNOTATION_PRIORITY_DECISION)
        workload = workload_of(pod, request.name)
        placement = (
            self.placement(pod, namespace)
            if view.admission is not None and view.admission.get("exhausted_models")
            else None
        )
        reuse = self.workloads.admit(
            namespace,
            workload,
            datetime.now(UTC),
            creator=request.username,
            share=share.share,
            arrived_decided=previous is not None,
            dry_run=request.dry_run,
        )
        decision = self.priority.decide(
            spec,
            view,
            previous,
            namespace=namespace,
            workload=workload.annotation,
            kept=reuse.kept,
            refused=reuse.refused,
            placement=placement,
        )
        decision.apply(spec)
        if decision.steer_off:
            steer(spec, decision.steer_off)
        if (grace := governance.capped_grace(spec, self.settings)) is not None:
            spec["terminationGracePeriodSeconds"] = grace
        share_text = format_share(share.share)
        metadata["annotations"] = {
            **{key: value for key, value in annotations.items() if key not in BOUND_ANNOTATIONS},
            names.ANNOTATION_GPU_SHARE: share_text,
            names.ANNOTATION_SHARING_SYSTEM: str(share.system),
            names.ANNOTATION_BUDGET_STATE: decision.budget_state or "unknown",
            names.ANNOTATION_PRIORITY_DECISION: decision.annotation,
            names.ANNOTATION_INJECTED: self.settings.sidecar_image,
            names.ANNOTATION_WORKLOAD: workload.annotation,
            names.ANNOTATION_CREATED_BY: request.username,
            **reuse.annotations,
            **models_off(view, placement, decision.steer_off),
        }
        metadata["labels"] = {**(metadata.get("labels") or {}), names.LABEL_GPU_POD: "true"}
        self.sidecar.inject(spec, share_text, share.claims)
        patch = diff(pod, {**pod, "metadata": metadata, "spec": spec})
        if patch:
            return AdmissionResponse("patched", patch=tuple(patch), priority=decision)
        return AdmissionResponse("unchanged", priority=decision)

    def violations(self, request: AdmissionRequest) -> list[Violation]:
        if request.operation == "CONNECT":
            return governance.sidecar_session(request)
        pod = request.object
        if (
            not request.is_pod
            or pod is None
            or request.operation not in ("CREATE", "UPDATE")
            or _is_mirror(request, pod)
        ):
            return []
        if request.subresource not in (None, "", "ephemeralcontainers"):
            return []
        namespace = self._namespace(request, pod)
        share = self.read(pod, namespace)
        if request.subresource == "ephemeralcontainers":
            added = governance.supply_routes_added(request, namespace, share, self.hardware)
            return governance.token_mounts(pod) + added
        if request.operation == "UPDATE":
            found = governance.on_update(request, self.settings, self.hardware.catalogue)
            found.extend(governance.supply_routes_added(request, namespace, share, self.hardware))
        else:
            found = governance.on_create(pod, share, self.cache.view(namespace), self.sidecar)
            if share.uses_gpu:
                found.extend(governance.reduced_grace(pod, self.settings))
            found.extend(governance.supply_routes(pod, namespace, share, self.hardware))
        if (label := self.gangs.pod_label_violation(request)) is not None:
            found.append(label)
        return found

    def validate(self, request: AdmissionRequest) -> AdmissionResponse:
        pod = _new_pod(request)
        if pod is not None and (too_many := self._over_container_cap(request, pod)) is not None:
            return too_many
        found = self.violations(request)
        if not found:
            return ALLOWED
        enforced = [v for v in found if self.settings.enforces(v.rule)]
        warnings = tuple(v.describe() for v in found if not self.settings.enforces(v.rule))
        if not enforced:
            return AdmissionResponse("warned", warnings=warnings)
        message = f"{_describe_pod(request, request.object or {})}: " + "; ".join(
            v.describe() for v in enforced
        )
        rules = tuple(sorted({str(v.rule) for v in enforced}))
        return AdmissionResponse("denied", warnings=warnings, denial=Denial(message, rules))
