"""Steering a pod off GPU models whose own budget is exhausted: a required node affinity requirement
`nvidia.com/gpu.product NotIn [...]` added to every term the pod's required node affinity has, or one term
where it has none. Every term only gains a requirement, so where the pod may run only narrows
(docs/webhook.md#model-budgets)."""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any, Final

from gpuaccounting.placement import PRODUCT_LABEL, required_terms

# A label value the API server accepts (what a NotIn may list): at most 63 characters.
_LABEL_VALUE: Final = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def is_label_value(value: str) -> bool:
    return bool(_LABEL_VALUE.match(value))


def _is_empty(term: dict[str, Any]) -> bool:
    return not term.get("matchExpressions") and not term.get("matchFields")


def can_steer(spec: dict[str, Any]) -> bool:
    """Whether the scheduler places the pod and its required terms are ones we can add to: no `nodeName`
    (it bypasses the scheduler), and no required node affinity, or terms that are objects whose
    requirements are lists. Anything else is not steered (the reduced class instead)."""
    if spec.get("nodeName"):
        return False
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    if affinity is not None and not isinstance(affinity, dict):
        return False
    if node_affinity is not None and not isinstance(node_affinity, dict):
        return False
    if (node_affinity or {}).get("requiredDuringSchedulingIgnoredDuringExecution") is None:
        return True
    terms = required_terms(spec)
    if not isinstance(terms, list) or not terms:
        return False
    return all(
        isinstance(term, dict) and isinstance(term.get("matchExpressions", []), list) for term in terms
    )


def steer(spec: dict[str, Any], labels: Sequence[str]) -> None:
    """Add `PRODUCT_LABEL NotIn labels` to every non-empty required term of `spec` (a copy of the
    affinity is changed, never the caller's nested objects), or one term when there is no required node
    affinity. An empty term matches no node and is left so. Call only where `can_steer(spec)`."""
    requirement = {"key": PRODUCT_LABEL, "operator": "NotIn", "values": list(labels)}
    affinity = copy.deepcopy(spec.get("affinity") or {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{"matchExpressions": [requirement]}]
        }
    else:
        for term in required["nodeSelectorTerms"]:
            # A re-invoked pod's terms have it already (a pass that reads an empty term as any model steers
            # again): added once.
            if not _is_empty(term) and requirement not in term.get("matchExpressions", []):
                term["matchExpressions"] = [*term.get("matchExpressions", []), dict(requirement)]
    spec["affinity"] = affinity
