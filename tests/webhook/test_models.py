"""Model budgets at /mutate (issue 41): a pod that can land on a GPU model whose own budget is exhausted gets
the reduced class, or is steered off it at the in-budget class; what a tenant writes cannot hide a model."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from gpuaccounting import names
from gpuaccounting.admission_state import ModelPolicy
from gpuaccounting.gpumodels import DEFAULT_GPU_MODELS, NVIDIA_MIG_PROFILE_MODELS, model_match_key
from gpuaccounting.placement import PRODUCT_LABEL, pod_models
from tests.support.admission_state_server import StateServer, entry
from tests.support.pods import container, pod
from tests.webhook.conftest import Publish, Tls, Webhook, serve_webhook
from webhook.decisions.priority import PriorityDecider, PriorityDecision, PriorityRule
from webhook.settings import WebhookSettings
from webhook.watches.budgetcache import NamespaceView
from webhook.watches.dra import CLAIMS, CLASSES, TEMPLATES, DraObjects
from webhook.watches.priorityclasses import PriorityClassCatalog
from webhook.watches.workloads import WorkloadClass, _inherited_while_exhausted

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
REDUCED, IN_BUDGET = "gpu-over-budget", "gpu-in-budget"


def gpu_pod(**spec: Any) -> dict[str, Any]:
    return pod(container("train", {"nvidia.com/gpu": 1}), **spec)


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }


def product(operator: str, *values: str) -> dict[str, Any]:
    built: dict[str, Any] = {"key": PRODUCT_LABEL, "operator": operator}
    if operator in ("In", "NotIn"):
        built["values"] = list(values)
    return built


def decision(patched: dict[str, Any]) -> str:
    return str(patched["metadata"]["annotations"][names.ANNOTATION_PRIORITY_DECISION])


@pytest.fixture
def h100_spent(publish: Publish) -> None:
    publish(namespaces={"team-a": entry("in_budget", exhausted_models=[H100])})


@pytest.fixture
def h100_steered(publish: Publish) -> None:
    publish(namespaces={"team-a": entry("in_budget", exhausted_models=[H100], model_policy="steer")})


def test_a_pod_selecting_the_exhausted_model_gets_the_reduced_class(
    webhook: Webhook, h100_spent: None
) -> None:
    patched = webhook.admit(gpu_pod(nodeSelector={PRODUCT_LABEL: H100}))
    assert patched["spec"]["priorityClassName"] == REDUCED
    assert decision(patched) == f"model-exhausted: model {H100} exhausted"
    assert patched["metadata"]["annotations"][names.ANNOTATION_BUDGET_STATE] == "in_budget"
    assert webhook.validate(patched).allowed


def test_a_pod_selecting_another_model_keeps_the_in_budget_class(webhook: Webhook, h100_spent: None) -> None:
    patched = webhook.admit(gpu_pod(nodeSelector={PRODUCT_LABEL: A100}))
    assert patched["spec"]["priorityClassName"] == IN_BUDGET
    assert decision(patched).startswith("in-budget: ")
    assert "affinity" not in patched["spec"]


HOSTILE = {
    "no selection": {},
    "labels claiming a model": {"labels": {PRODUCT_LABEL: A100, "gpu-model": A100}},
    "NotIn nothing": {"affinity": required({"matchExpressions": [product("NotIn")]})},
    "NotIn another model": {"affinity": required({"matchExpressions": [product("NotIn", A100)]})},
    "NotIn in lower case": {"affinity": required({"matchExpressions": [product("NotIn", H100.lower())]})},
    "Exists": {"affinity": required({"matchExpressions": [product("Exists")]})},
    "a second OR term without the product": {
        "affinity": required(
            {"matchExpressions": [product("In", A100)]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        )
    },
    "preferred affinity only": {
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "preference": {"matchExpressions": [product("In", A100)]}}
                ]
            }
        }
    },
    "the model in lower case": {"nodeSelector": {PRODUCT_LABEL: H100.lower()}},
    "NVML's spelling with blanks": {
        "affinity": required({"matchExpressions": [product("In", "NVIDIA H100 80GB HBM3", A100)]})
    },
    "a node name": {"nodeName": "gpu-node-1", "nodeSelector": {PRODUCT_LABEL: A100}},
}


@pytest.mark.parametrize("written", HOSTILE.values(), ids=HOSTILE.keys())
def test_what_a_tenant_writes_does_not_get_past_a_model_budget(
    webhook: Webhook, h100_spent: None, written: dict[str, Any]
) -> None:
    written = dict(written)
    labels = written.pop("labels", None)
    patched = webhook.admit(gpu_pod(labels=labels, **written))
    assert patched["spec"]["priorityClassName"] == REDUCED
    assert decision(patched).startswith("model-exhausted: ")


def test_a_mig_profile_pins_no_model_by_default(webhook: Webhook, h100_spent: None) -> None:
    """Without `mig_profile_models` in the hardware file, a profile is any model: an A30-only profile's pod
    is reduced too, since a board outside NVIDIA's table may have that profile."""
    a30_only = webhook.admit(pod(container("train", {"nvidia.com/mig-2g.12gb": 1})))
    assert a30_only["spec"]["priorityClassName"] == REDUCED


def test_a_mig_profile_of_two_boards_can_land_on_the_exhausted_one(
    tls: Tls, state: StateServer, webhook: Webhook, h100_spent: None, tmp_path: Path
) -> None:
    hardware = tmp_path / "hardware.json"
    hardware.write_text(json.dumps({"mig_profile_models": NVIDIA_MIG_PROFILE_MODELS}))
    with serve_webhook(tls, state, hardware_file=hardware) as boards:
        boards.wait_until(lambda: boards.metric("webhook_state_version") == state.state["version"])
        patched = boards.admit(pod(container("train", {"nvidia.com/mig-3g.40gb": 1})))
        assert patched["spec"]["priorityClassName"] == REDUCED
        a30_only = boards.admit(pod(container("train", {"nvidia.com/mig-2g.12gb": 1})))
        assert a30_only["spec"]["priorityClassName"] == IN_BUDGET


def test_a_namespace_exhausted_in_total_is_decided_as_before(webhook: Webhook, publish: Publish) -> None:
    publish(namespaces={"team-a": entry("exhausted", exhausted_models=[H100], model_policy="steer")})
    patched = webhook.admit(gpu_pod(nodeSelector={PRODUCT_LABEL: A100}))
    assert patched["spec"]["priorityClassName"] == REDUCED
    assert decision(patched) == "exhausted: namespace exhausted"
    assert "affinity" not in patched["spec"]


def test_steering_adds_a_required_not_in_at_the_in_budget_class(webhook: Webhook, h100_steered: None) -> None:
    patched = webhook.admit(gpu_pod())
    assert patched["spec"]["priorityClassName"] == IN_BUDGET
    assert decision(patched) == f"steered: steered off exhausted model {H100}; no class chosen"
    terms = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {"nodeSelectorTerms": [{"matchExpressions": [product("NotIn", H100)]}]}
    kubernetes_validate.validate(patched, kubernetes_validate.utils.latest_version(), strict=True)
    assert webhook.validate(patched).allowed
    assert webhook.mutate(patched).patch == []  # re-invoked: nothing more to do


def test_steering_narrows_every_term_the_pod_has(webhook: Webhook, h100_steered: None) -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    original = gpu_pod(
        affinity=required({"matchExpressions": [zone]}, {"matchExpressions": [product("NotIn", A100)]})
    )
    patched = webhook.admit(original)
    assert patched["spec"]["priorityClassName"] == IN_BUDGET
    terms = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {"matchExpressions": [zone, product("NotIn", H100)]},
        {"matchExpressions": [product("NotIn", A100), product("NotIn", H100)]},
    ]


@pytest.mark.parametrize(
    "written",
    [{"nodeSelector": {PRODUCT_LABEL: H100}}, {"nodeName": "gpu-node-1"}],
    ids=["selects only the exhausted model", "names its node"],
)
def test_a_pod_that_cannot_be_steered_off_gets_the_reduced_class(
    webhook: Webhook, h100_steered: None, written: dict[str, Any]
) -> None:
    patched = webhook.admit(gpu_pod(**written))
    assert patched["spec"]["priorityClassName"] == REDUCED
    assert decision(patched).startswith("model-exhausted: ")
    assert "affinity" not in patched["spec"]


def test_a_tenants_own_steering_is_honoured_only_as_the_scheduler_reads_it(
    webhook: Webhook, h100_steered: None
) -> None:
    """A NotIn that keeps the pod off the H100 needs no steering; one in another spelling is steered."""
    exact = webhook.admit(gpu_pod(affinity=required({"matchExpressions": [product("NotIn", H100)]})))
    assert exact["spec"]["priorityClassName"] == IN_BUDGET and decision(exact).startswith("in-budget: ")
    spelled = webhook.admit(
        gpu_pod(affinity=required({"matchExpressions": [product("NotIn", H100.lower())]}))
    )
    assert decision(spelled).startswith("steered: ")
    assert spelled["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ] == [{"matchExpressions": [product("NotIn", H100.lower()), product("NotIn", H100)]}]


def test_the_dra_watch_yields_what_each_claim_pins() -> None:
    """A claim pins its models through its own selectors or its DeviceClass's; one that matches everything,
    or is not known, pins none."""
    objects = DraObjects()
    h100s = (
        "device.driver == 'gpu.nvidia.com'"
        " && device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
    )
    objects.replace_all(
        CLASSES, [{"metadata": {"name": "h100s"}, "spec": {"selectors": [{"cel": {"expression": h100s}}]}}]
    )

    def claim(name: str, device_class: str, expression: str | None = None) -> dict[str, Any]:
        request: dict[str, Any] = {"name": "gpu", "deviceClassName": device_class}
        if expression:
            request["selectors"] = [{"cel": {"expression": expression}}]
        return {
            "metadata": {"namespace": "team-a", "name": name},
            "spec": {"devices": {"requests": [{"exactly": request}]}},
        }

    objects.put(CLAIMS, claim("by-class", "h100s"))
    objects.put(
        CLAIMS,
        claim(
            "everything", "gpu.nvidia.com", "true || device.attributes['gpu.nvidia.com'].productName == 'X'"
        ),
    )
    objects.put(
        TEMPLATES,
        {
            "metadata": {"namespace": "team-a", "name": "a100"},
            "spec": claim(
                "",
                "gpu.nvidia.com",
                "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-80GB'",
            ),
        },
    )
    consumer = pod(
        container("train"),
        resourceClaims=[
            {"name": "a", "resourceClaimName": "by-class"},
            {"name": "b", "resourceClaimName": "everything"},
            {"name": "c", "resourceClaimTemplateName": "a100"},
            {"name": "d", "resourceClaimName": "missing"},
        ],
    )
    assert objects.claim_models("team-a", consumer, DEFAULT_GPU_MODELS) == [
        frozenset({model_match_key(H100)}),
        None,
        frozenset({model_match_key(A100)}),
        None,
    ]


def test_a_workload_keeps_its_class_past_a_model_budget_and_passes_it_on_to_no_one() -> None:
    """As in an exhausted namespace: a later pod of an in-budget workload keeps the class (a gang at one
    class), steered where the namespace steers, and a pod that kept it while its model was spent is no
    source for later pods."""
    decider = PriorityDecider(WebhookSettings(watch_priority_classes=False), PriorityClassCatalog())
    kept = WorkloadClass(datetime.now(UTC), "first", IN_BUDGET, 1000, "PreemptLowerPriority")
    on_h100: dict[str, Any] = {"nodeSelector": {PRODUCT_LABEL: H100}}
    free: dict[str, Any] = {"affinity": required({"matchExpressions": [product("NotIn", A100)]})}

    def decide(spec: dict[str, Any], policy: ModelPolicy) -> PriorityDecision:
        view = NamespaceView(entry("in_budget", exhausted_models=[H100], model_policy=policy), "fresh", 0.0)
        placement = pod_models(spec, DEFAULT_GPU_MODELS)
        return decider.decide(
            spec, view, namespace="team-a", workload="Job/train", kept=kept, placement=placement
        )

    reduced = decide(on_h100, "reduce")
    kept_words = f"workload-class-kept: workload Job/train keeps class {IN_BUDGET}"
    assert (reduced.rule, reduced.class_name) == (PriorityRule.WORKLOAD_CLASS_KEPT, IN_BUDGET)
    assert reduced.annotation == f"{kept_words}; model budget exhausted: {H100}"
    assert _inherited_while_exhausted({names.ANNOTATION_PRIORITY_DECISION: reduced.annotation})
    assert not _inherited_while_exhausted({names.ANNOTATION_PRIORITY_DECISION: kept_words})
    steered = decide(free, "steer")
    assert steered.rule == PriorityRule.WORKLOAD_CLASS_KEPT and steered.steer_off == (H100,)
