"""Which GPU models a pod can land on, read before it is scheduled from what the scheduler will honour: the
GPU product label in its node selector and required node affinity, its MIG profiles, node pool labels the
hardware file maps to models, and what its DRA claims pin. Anything not read exactly could be any model, so
a tenant's spec can only narrow what we believe, never hide a model (docs/webhook.md#model-budgets). Pure,
standard library only."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpuaccounting.gpumodels import MIG_RESOURCE_PREFIX, GpuModels, Models, model_match_key

# GPU Feature Discovery's label: the node's GPU product, NVML's name with blanks as dashes.
PRODUCT_LABEL: Final = "nvidia.com/gpu.product"


@dataclass(frozen=True, slots=True)
class Placement:
    """The models a pod can land on: those in `allowed` (match keys,
    `gpuaccounting.gpumodels.model_match_key`: a name in another case or spelling is the same model, so a
    tenant's spelling never narrows it; None: any model)
    whose node label is not one of `excluded` (label values exactly as written: the scheduler's `NotIn`
    compares them so, and `nvidia-h100-80gb-hbm3` keeps no node labelled `NVIDIA-H100-80GB-HBM3` out)."""

    allowed: Models | None = None
    excluded: frozenset[str] = frozenset()

    def open_to(self, label: str) -> bool:
        """Whether the pod can land on the model a node labels `label` (its label spelling)."""
        if label in self.excluded:
            return False
        return self.allowed is None or model_match_key(label) in self.allowed

    def beyond(self, labels: Iterable[str]) -> bool:
        """Whether the pod can land on some model other than these: with `allowed` None, always (a list of
        models is never every model)."""
        if self.allowed is None:
            return True
        named = {model_match_key(label) for label in labels}
        shut = {model_match_key(label) for label in self.excluded}
        return bool(self.allowed - named - shut)

    def both(self, other: Placement) -> Placement:
        """Where both hold (requirements ANDed)."""
        if self.allowed is None or other.allowed is None:
            allowed = self.allowed if other.allowed is None else other.allowed
        else:
            allowed = self.allowed & other.allowed
        return Placement(allowed, self.excluded | other.excluded)

    def either(self, other: Placement) -> Placement:
        """Where either holds (node selector terms ORed), or a little more: a label stays excluded only if
        neither side lets it in."""
        allowed = None if self.allowed is None or other.allowed is None else self.allowed | other.allowed
        excluded = frozenset(
            label
            for label in self.excluded | other.excluded
            if not self.open_to(label) and not other.open_to(label)
        )
        return Placement(allowed, excluded)


ANY_MODEL: Final = Placement()
NO_MODEL: Final = Placement(frozenset())


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _strings(value: object) -> list[str] | None:
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    return None


def _expression(expression: Mapping[str, Any], models: GpuModels) -> Placement:
    """One node selector requirement. On the product label: In, NotIn exactly (Exists, DoesNotExist, Gt, Lt
    bound nothing we can name: a node without the label may hold any GPU). On a node pool label: In, where
    every value is a mapped pool. Anything else: any model."""
    key, operator, values = (
        expression.get("key"),
        expression.get("operator"),
        _strings(expression.get("values")),
    )
    if not isinstance(key, str) or values is None:
        return ANY_MODEL
    if key == PRODUCT_LABEL:
        if operator == "In":
            return Placement(frozenset(model_match_key(value) for value in values))
        if operator == "NotIn":
            return Placement(None, frozenset(values))
        return ANY_MODEL
    if operator == "In" and values and models.is_pool_label(key):
        found: set[str] = set()
        for value in values:
            pool = models.pool_models(key, value)
            if pool is None:
                return ANY_MODEL
            found |= pool
        return Placement(frozenset(found))
    return ANY_MODEL


def _term(term: object, models: GpuModels) -> Placement:
    """One node selector term: its requirements ANDed. An empty or malformed term is taken as any model
    (the scheduler matches nothing with an empty term; believing more than it does is the safe side)."""
    expressions = _mapping(term).get("matchExpressions")
    if not isinstance(expressions, list) or not expressions:
        return ANY_MODEL
    placement = ANY_MODEL
    for expression in expressions:
        placement = placement.both(_expression(_mapping(expression), models))
    return placement


def required_terms(spec: Mapping[str, Any]) -> object:
    """The pod's required node affinity terms as written (None when it has no required node affinity)."""
    affinity = _mapping(_mapping(spec.get("affinity")).get("nodeAffinity"))
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    return None if required is None else _mapping(required).get("nodeSelectorTerms")


def _affinity(spec: Mapping[str, Any], models: GpuModels) -> Placement:
    """Required node affinity: its terms ORed. Preferred affinity never constrains."""
    terms = required_terms(spec)
    if not isinstance(terms, list) or not terms:
        return ANY_MODEL
    placement: Placement | None = None
    for term in terms:
        found = _term(term, models)
        placement = found if placement is None else placement.either(found)
    return placement or ANY_MODEL


def _node_selector(spec: Mapping[str, Any], models: GpuModels) -> Placement:
    placement = ANY_MODEL
    for key, value in _mapping(spec.get("nodeSelector")).items():
        if not isinstance(value, str):
            continue
        if key == PRODUCT_LABEL:
            placement = placement.both(Placement(frozenset({model_match_key(value)})))
        elif (pool := models.pool_models(key, value)) is not None:
            placement = placement.both(Placement(pool))
    return placement


def _containers(spec: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for field in ("initContainers", "containers"):
        listed = spec.get(field)
        for container in listed if isinstance(listed, list) else ():
            yield _mapping(container)


def _mig(spec: Mapping[str, Any], models: GpuModels) -> Placement:
    """Each MIG profile a container asks for (mixed strategy) must exist on the pod's node."""
    placement = ANY_MODEL
    for container in _containers(spec):
        resources = _mapping(container.get("resources"))
        for field in ("limits", "requests"):
            for name in _mapping(resources.get(field)):
                if isinstance(name, str) and name.startswith(MIG_RESOURCE_PREFIX):
                    found = models.profile_models(name.removeprefix(MIG_RESOURCE_PREFIX))
                    if found is not None:
                        placement = placement.both(Placement(found))
    return placement


def _claims(claim_models: Sequence[Models | None]) -> Placement:
    """The pod's GPUs from its claims are those of one of the claims' devices: the union of what each
    pins, any model if one pins none."""
    if not claim_models:
        return ANY_MODEL
    found: set[str] = set()
    for pinned in claim_models:
        if pinned is None:
            return ANY_MODEL
        found |= pinned
    return Placement(frozenset(found))


def pod_models(
    spec: Mapping[str, Any], models: GpuModels, claim_models: Sequence[Models | None] = ()
) -> Placement:
    """Where the pod can land, by model. `claim_models`: what each of its GPU claims pins (None: nothing,
    see `selector_models`). A pod that names its node (`spec.nodeName`) bypasses the scheduler: any model."""
    if spec.get("nodeName"):
        return ANY_MODEL
    return (
        _node_selector(spec, models)
        .both(_affinity(spec, models))
        .both(_mig(spec, models))
        .both(_claims(claim_models))
    )


# A CEL selector pins a model only as a whole expression of plain equalities joined by `&&` (the rule
# gpuaccounting.dra applies to MIG profiles): `device.attributes['gpu.nvidia.com'].productName == '...'`.
_QUOTED: Final = r"""(?:'[^'\\\n]*'|"[^"\\\n]*")"""
_ATTRIBUTE: Final = rf"""attributes\[\s*{_QUOTED}\s*\]\.[A-Za-z][A-Za-z0-9_]*"""
_EQUALITY: Final = rf"""device\.(?:driver|{_ATTRIBUTE})\s*==\s*{_QUOTED}"""
_CONJUNCTION: Final = re.compile(rf"""^\s*{_EQUALITY}(?:\s*&&\s*{_EQUALITY})*\s*$""")
_CONJUNCT: Final = re.compile(rf"""\s*(?:&&\s*)?({_EQUALITY})""")
_PINNED: Final = re.compile(
    r"""device\.attributes\[\s*['"]gpu\.nvidia\.com['"]\s*\]\.(productName|profile)\s*==\s*['"]([^'"]{1,128})['"]"""
)


def expression_models(expression: object, models: GpuModels) -> Models | None:
    """The models a selector's CEL expression pins every device it admits to: its product name, or the
    models its MIG profile exists on; None when it pins none or is not read exactly."""
    if not isinstance(expression, str) or not _CONJUNCTION.match(expression):
        return None
    pinned: Models | None = None
    position = 0
    while conjunct := _CONJUNCT.match(expression, position):  # in order, so a quoted `&&` stays quoted
        position = conjunct.end()
        if found := _PINNED.fullmatch(conjunct.group(1)):
            attribute, value = found.groups()
            these = (
                frozenset({model_match_key(value)})
                if attribute == "productName"
                else models.profile_models(value)
            )
            if these is not None:
                pinned = these if pinned is None else pinned & these
    return pinned


def selector_models(selectors: object, models: GpuModels) -> Models | None:
    """What a list of CEL selectors pins (each must hold: the intersection of those that pin); None when
    none pins."""
    pinned: Models | None = None
    for selector in selectors if isinstance(selectors, list) else ():
        found = expression_models(_mapping(_mapping(selector).get("cel")).get("expression"), models)
        if found is not None:
            pinned = found if pinned is None else pinned & found
    return pinned


def _request_models(
    request: Mapping[str, Any], class_models: Mapping[str, Models | None], models: GpuModels
) -> Models | None:
    """One exact request: its own selectors and its DeviceClass's, both of which every device must pass."""
    own = selector_models(request.get("selectors"), models)
    name = request.get("deviceClassName")
    by_class = class_models.get(name) if isinstance(name, str) else None
    if own is None or by_class is None:
        return own if by_class is None else by_class
    return own & by_class


def claim_models(
    spec: Mapping[str, Any], class_models: Mapping[str, Models | None], models: GpuModels
) -> Models | None:
    """The models a ResourceClaim spec's devices can be: the union over its requests (and each request's
    alternatives); None as soon as one of them pins nothing."""
    found: set[str] = set()
    requests = _mapping(spec.get("devices")).get("requests")
    for request in requests if isinstance(requests, list) else ():
        request = _mapping(request)
        if "firstAvailable" in request:
            alternatives = request["firstAvailable"]
            options = [_mapping(a) for a in alternatives] if isinstance(alternatives, list) else []
        else:  # v1 and v1beta2 `exactly`, v1beta1 the request itself
            options = [_mapping(request.get("exactly", request))]
        for option in options:
            pinned = _request_models(option, class_models, models)
            if pinned is None:
                return None
            found |= pinned
    return frozenset(found) if found else None
