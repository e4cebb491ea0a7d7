"""The DRA objects the decisions read (ResourceClaimTemplates, ResourceClaims, DeviceClasses), watched in the
resource.k8s.io version the API server serves. A claim not seen yet is fetched once by name before the pod
is judged, so only one that truly does not exist fails closed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpuaccounting.dra import ClaimRef, ClaimSpecs, claim_refs, class_drivers
from gpuaccounting.gpumodels import GpuModels, Models
from gpuaccounting.placement import claim_models, selector_models
from webhook.metrics import WebhookMetrics
from webhook.settings import WebhookSettings
from webhook.watches.kubewatch import ListWatch

log = logging.getLogger("webhook.dra")

GROUP: Final = "resource.k8s.io"
VERSIONS: Final = ("v1", "v1beta2", "v1beta1")  # the newest the server serves is used
TEMPLATES: Final = "resourceclaimtemplates"
CLAIMS: Final = "resourceclaims"
CLASSES: Final = "deviceclasses"

Key = tuple[str, str]  # namespace, name


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _key(obj: Mapping[str, Any]) -> Key:
    metadata = _metadata(obj)
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


def _claim_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def _template_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _claim_spec(_claim_spec(obj))  # a template's spec.spec is the claim spec it makes


class DraObjects:
    """The claim specs by namespace and name, and each DeviceClass's drivers, as last listed and watched."""

    def __init__(self) -> None:
        self.templates: dict[Key, Mapping[str, Any]] = {}
        self.claims: dict[Key, Mapping[str, Any]] = {}
        self.drivers: dict[str, frozenset[str]] = {}
        self.class_selectors: dict[str, object] = {}  # each DeviceClass's CEL selectors, for the models
        self.version: str | None = None  # the resource.k8s.io version served; None until discovered

    def specs(self, namespace: str) -> ClaimSpecs:
        """The claim spec a pod's entry names in `namespace`; None for one not (yet) known."""

        def spec(ref: ClaimRef) -> Mapping[str, Any] | None:
            if ref.claim is not None:
                return self.claims.get((namespace, ref.claim))
            if ref.template is not None:
                return self.templates.get((namespace, ref.template))
            return None

        return spec

    def claim_models(self, namespace: str, pod: Mapping[str, Any], models: GpuModels) -> list[Models | None]:
        """What each claim the pod names pins its devices' models to (gpuaccounting.placement): None for a
        claim not known, or whose selectors and class pin no model."""
        refs = claim_refs(pod)
        if not refs:
            return []
        spec = self.specs(namespace)
        by_class = {name: selector_models(found, models) for name, found in self.class_selectors.items()}
        return [
            None if (found := spec(ref)) is None else claim_models(found, by_class, models) for ref in refs
        ]

    def missing(self, namespace: str, pod: Mapping[str, Any]) -> list[tuple[str, str]]:
        """The (plural, name) of each claim or template the pod names that the view does not hold."""
        found = []
        for ref in claim_refs(pod):
            if ref.claim is not None and (namespace, ref.claim) not in self.claims:
                found.append((CLAIMS, ref.claim))
            elif ref.template is not None and (namespace, ref.template) not in self.templates:
                found.append((TEMPLATES, ref.template))
        return found

    def put(self, plural: str, obj: Mapping[str, Any]) -> None:
        if plural == TEMPLATES:
            self.templates[_key(obj)] = _template_spec(obj)
        elif plural == CLAIMS:
            self.claims[_key(obj)] = _claim_spec(obj)
        else:
            self.drivers[str(_metadata(obj).get("name"))] = class_drivers(obj)
            self.class_selectors[str(_metadata(obj).get("name"))] = _claim_spec(obj).get("selectors")

    def remove(self, plural: str, obj: Mapping[str, Any]) -> None:
        if plural == CLASSES:
            self.drivers.pop(str(_metadata(obj).get("name")), None)
            self.class_selectors.pop(str(_metadata(obj).get("name")), None)
        else:
            (self.templates if plural == TEMPLATES else self.claims).pop(_key(obj), None)

    def replace_all(self, plural: str, items: Iterable[Mapping[str, Any]]) -> None:
        if plural == TEMPLATES:
            self.templates = {_key(obj): _template_spec(obj) for obj in items}
        elif plural == CLAIMS:
            self.claims = {_key(obj): _claim_spec(obj) for obj in items}
        else:
            items = list(items)
            self.drivers = {str(_metadata(obj).get("name")): class_drivers(obj) for obj in items}
            self.class_selectors = {
                str(_metadata(obj).get("name")): _claim_spec(obj).get("selectors") for obj in items
            }


async def served_version(kube: client.ApiClient) -> str | None:
    """The newest resource.k8s.io version the API server serves; None where it serves none."""
    groups = await client.ApisApi(kube).get_api_versions()
    for group in groups.groups:
        if group.name == GROUP:
            served = {version.version for version in group.versions}
            return next((version for version in VERSIONS if version in served), None)
    return None


class DraWatch:
    """Discovers the version, then keeps the three views current; fetches what a pod names but is missing."""

    def __init__(
        self, kube: client.ApiClient, objects: DraObjects, metrics: WebhookMetrics, settings: WebhookSettings
    ) -> None:
        self.api = client.CustomObjectsApi(kube)
        self.kube = kube
        self.objects = objects
        self.metrics = metrics
        self.settings = settings

    def _watch(self, version: str, plural: str) -> ListWatch:
        def list_call(**options: Any) -> Any:
            return self.api.list_cluster_custom_object(GROUP, version, plural, **options)

        def apply(kind: str, obj: Mapping[str, Any]) -> None:
            if kind == "DELETED":
                self.objects.remove(plural, obj)
            else:
                self.objects.put(plural, obj)

        replace: Callable[[Iterable[Any]], None] = lambda items: self.objects.replace_all(plural, items)  # noqa: E731
        return ListWatch(
            f"dra_{plural}", list_call, replace, apply, self.metrics.dra_watch_errors, self.settings
        )

    async def run(self) -> None:
        while self.objects.version is None:
            try:
                self.objects.version = await served_version(self.kube)
            except Exception as error:  # the API server unreachable: look again, as for no group
                self.metrics.dra_watch_errors.inc()
                log.warning("dra_discovery_failed", extra={"error": str(error)[:500]})
            if self.objects.version is None:
                await asyncio.sleep(self.settings.dra_discovery_interval_seconds)
        log.info("dra_version_found", extra={"version": self.objects.version})
        watches = [self._watch(self.objects.version, plural) for plural in (TEMPLATES, CLAIMS, CLASSES)]
        await asyncio.gather(*(each.run() for each in watches))

    async def fetch_missing(self, namespace: str, pod: Mapping[str, Any]) -> None:
        """Read each claim or template the pod names that the view lacks (one GET each, short timeout)."""
        version = self.objects.version
        if version is None:
            return
        for plural, name in self.objects.missing(namespace, pod):
            try:
                obj = await self.api.get_namespaced_custom_object(
                    GROUP,
                    version,
                    namespace,
                    plural,
                    name,
                    _request_timeout=self.settings.dra_fetch_timeout_seconds,
                )
            except ApiException as error:
                if error.status != 404:
                    self.metrics.dra_watch_errors.inc()
                continue
            except Exception:  # a timeout or a broken connection: judged on what the view holds
                self.metrics.dra_watch_errors.inc()
                continue
            self.objects.put(plural, obj)
