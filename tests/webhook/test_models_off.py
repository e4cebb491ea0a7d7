"""A workload's pod kept off an exhausted GPU model passes its class onto no pod that can land on that model
(a StatefulSet's template pointed at the H100 after its A100 pods were admitted in budget); one admitted
before the model was exhausted still does (docs/webhook.md#model-budgets)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpuaccounting import names
from gpuaccounting.gpumodels import DEFAULT_GPU_MODELS
from gpuaccounting.placement import PRODUCT_LABEL, pod_models
from tests.support.admission_state_server import entry
from tests.support.pods import container, pod
from tests.webhook.conftest import Publish, Webhook
from webhook.decisions.priority import PriorityDecider, PriorityDecision, PriorityRule
from webhook.settings import WebhookSettings
from webhook.watches.budgetcache import NamespaceView
from webhook.watches.priorityclasses import PriorityClassCatalog
from webhook.watches.workloads import WorkloadClass, parsed_models

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
REDUCED, IN_BUDGET = "gpu-over-budget", "gpu-in-budget"


def decide(kept: WorkloadClass, spec: dict[str, Any]) -> PriorityDecision:
    decider = PriorityDecider(WebhookSettings(watch_priority_classes=False), PriorityClassCatalog())
    view = NamespaceView(entry("in_budget", exhausted_models=[H100]), "fresh", 0.0)
    return decider.decide(
        spec,
        view,
        namespace="team-a",
        workload="StatefulSet/swap",
        kept=kept,
        placement=pod_models(spec, DEFAULT_GPU_MODELS),
    )


def source(models_off: frozenset[str]) -> WorkloadClass:
    return WorkloadClass(
        datetime.now(UTC), "swap-0", IN_BUDGET, 1000, "PreemptLowerPriority", models_off=models_off
    )


def test_a_pod_keeps_no_class_onto_a_model_its_source_was_kept_off() -> None:
    on_h100: dict[str, Any] = {"nodeSelector": {PRODUCT_LABEL: H100}}

    swapped = decide(source(frozenset({H100})), on_h100)
    before = decide(source(frozenset()), on_h100)  # admitted before the H100 was exhausted: kept, as designed

    assert (swapped.rule, swapped.class_name) == (PriorityRule.MODEL_EXHAUSTED, REDUCED)
    assert swapped.annotation.endswith(
        f"workload StatefulSet/swap keeps no class onto exhausted model {H100} (pod swap-0 was kept off it)"
    )
    assert (before.rule, before.class_name) == (PriorityRule.WORKLOAD_CLASS_KEPT, IN_BUDGET)
    assert parsed_models(f"{H100},{A100}") == {H100, A100} and parsed_models(None) == frozenset()


def test_mutate_records_the_exhausted_models_a_pod_is_kept_off(webhook: Webhook, publish: Publish) -> None:
    publish(namespaces={"team-a": entry("in_budget", exhausted_models=[H100])})
    on_a100 = pod(container("train", {"nvidia.com/gpu": 1}), nodeSelector={PRODUCT_LABEL: A100})
    forged = pod(container("train", {"nvidia.com/gpu": 1}), nodeSelector={PRODUCT_LABEL: H100})
    forged["metadata"]["annotations"] = {names.ANNOTATION_MODELS_OFF: H100}

    kept_off = webhook.admit(on_a100)["metadata"]["annotations"]
    reaching = webhook.admit(forged)["metadata"]["annotations"]

    assert kept_off[names.ANNOTATION_MODELS_OFF] == H100
    assert names.ANNOTATION_MODELS_OFF not in reaching  # a tenant's own value is dropped
