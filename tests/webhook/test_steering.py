"""Steering only narrows where a pod may run, and what we believe of a pod's models is never narrower than
where the scheduler lets it run: both checked against Kubernetes' node affinity rule on random specs and
nodes (hypothesis)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaccounting.gpumodels import DEFAULT_GPU_MODELS
from gpuaccounting.placement import PRODUCT_LABEL, pod_models
from webhook.decisions.steering import can_steer, steer

MODELS = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "nvidia-h100-80gb-hbm3", "Tesla-T4"]
KEYS = [PRODUCT_LABEL, "zone"]
VALUES = {PRODUCT_LABEL: MODELS, "zone": ["a", "b"]}


def _matches(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    return key not in labels  # DoesNotExist


def schedulable(spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """k8s.io/component-helpers' rule: nodeSelector ANDed with required terms, ORed; an empty term
    matches no node."""
    if any(labels.get(key) != value for key, value in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return True
    return any(
        term.get("matchExpressions") and all(_matches(e, labels) for e in term["matchExpressions"])
        for term in required["nodeSelectorTerms"]
    )


expressions = st.builds(
    lambda key, operator, values: (
        {"key": key, "operator": operator} | ({"values": values} if operator in ("In", "NotIn") else {})
    ),
    st.sampled_from(KEYS),
    st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]),
    st.lists(st.sampled_from([*MODELS, "a", "b"]), max_size=3),
)
terms = st.lists(expressions, max_size=3).map(lambda found: {"matchExpressions": found})
specs = st.builds(
    lambda selector, affinity: {
        **({"nodeSelector": selector} if selector else {}),
        **(
            {}
            if affinity is None
            else {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": affinity}
                    }
                }
            }
        ),
    },
    st.dictionaries(st.sampled_from(KEYS), st.sampled_from([*MODELS, "a"]), max_size=1),
    st.none() | st.lists(terms, min_size=1, max_size=3),
)
nodes = st.fixed_dictionaries(
    {}, optional={PRODUCT_LABEL: st.sampled_from(MODELS), "zone": st.sampled_from(["a", "b"])}
)


@settings(max_examples=500, deadline=None)
@given(specs, nodes, st.lists(st.sampled_from(MODELS), min_size=1, max_size=2))
def test_steering_only_narrows_and_keeps_the_pod_off_the_models(
    spec: dict[str, Any], node: dict[str, str], exhausted: list[str]
) -> None:
    assert can_steer(spec)
    original = copy.deepcopy(spec)
    steered = {**spec}
    steer(steered, exhausted)
    if schedulable(steered, node):
        assert schedulable(spec, node)  # never widens
        assert node.get(PRODUCT_LABEL) not in exhausted  # and keeps it off every exhausted model
    assert spec == original  # the caller's objects untouched: steer copies what it changes


@settings(max_examples=500, deadline=None)
@given(specs, nodes)
def test_a_pod_is_believed_open_to_every_model_it_can_be_scheduled_on(
    spec: dict[str, Any], node: dict[str, str]
) -> None:
    if schedulable(spec, node) and PRODUCT_LABEL in node:
        assert pod_models(spec, DEFAULT_GPU_MODELS).open_to(node[PRODUCT_LABEL])


def test_a_pod_naming_its_node_or_with_no_terms_is_not_steered() -> None:
    assert not can_steer({"nodeName": "n1"})
    empty = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    assert not can_steer({"affinity": empty})
    assert can_steer({"affinity": {"podAntiAffinity": {}}})
