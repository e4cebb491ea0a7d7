"""The webhooks' matchConditions are valid CEL and let exactly the GPU pods through.

The API server evaluates these expressions; no API server runs here, so `cel-python` (an implementation of
the CEL specification) parses them and evaluates them on pods of every sharing system. The expressions use
only standard CEL (has, exists, startsWith, in), which Kubernetes' cel-go accepts unchanged.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import celpy
import pytest

from gpuaccounting import shares
from gpuaccounting.hardware import load_hardware
from gpuaccounting.supply import DEFAULT_SUPPLY, route_uses
from tests.deployment.conftest import BUILDS, CHART_RENDERS, ROOT, render
from tests.support.supply import EVASION_PODS, ROUTE_PODS

GPU_RESOURCES = [
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/gpu-0",
    "amd.com/gpu",
    "gpu.intel.com/i915",
    "deviceclass.resource.kubernetes.io/gpu.nvidia.com",
    "nvidia.com/mig-1g.5gb",
    "nvidia.com/mig-3g.40gb",
    "nvidia.com/mig-1g.10gb.me",
    "nvidia.com/GA102GL_A10",
    "nvidia.com/NVIDIA_A10-12Q",
    "nvidia.com/2236",  # a passthrough GPU pci.ids does not name: denied by the webhook
    "nvidia.com/gpucores",
    "nvidia.com/gpumem",
    "tencent.com/vcuda-core",
    "tencent.com/vcuda-memory",
    "cnvrg.io/metagpu",
    "aliyun.com/gpu-mem",
    "aliyun.com/gpu-count",
    "volcano.sh/vgpu-number",
    "volcano.sh/vgpu-memory",
]
OTHER_RESOURCES = [
    "cpu",
    "memory",
    "ephemeral-storage",
    "intel.com/sriov_netdevice",
    "rdma/hca_shared_devices_a",
]


def pod(
    containers: list[dict[str, Any]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    spec: dict[str, Any] = {"containers": containers or [{"name": "main", "image": "busybox:1.36"}]}
    if init_containers:
        spec["initContainers"] = init_containers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def container(limits: dict[str, str] | None = None, requests: dict[str, str] | None = None) -> dict[str, Any]:
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v}
    return {"name": "c", "image": "busybox:1.36", "resources": resources}


def conditions(build: str) -> list[str]:
    return [
        condition["expression"]
        for obj in render(build)
        if obj["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for webhook in obj["webhooks"]
        if webhook["name"] in ("mutate.gpu-timekeeper.io", "validate.gpu-timekeeper.io")  # the pod webhooks
        for condition in webhook["matchConditions"]
    ]


@cache
def compiled(expression: str) -> celpy.Runner:
    """Parsing is most of cel-python's cost; the same few expressions are evaluated on every pod."""
    environment = celpy.Environment()
    return environment.program(environment.compile(expression))


def admitted_to_webhook(
    expression: str, obj: dict[str, Any] | None, old: dict[str, Any] | None = None
) -> bool:
    activation = {"object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old)}
    result = compiled(expression).evaluate(activation)
    assert isinstance(result, celpy.celtypes.BoolType), f"matchCondition gave {result!r}, not a bool"
    return bool(result)


@pytest.mark.parametrize("build", BUILDS)
def test_every_match_condition_parses_as_cel(build):
    expressions = conditions(build)
    assert len(expressions) == 2
    for expression in expressions:
        celpy.Environment().compile(expression)


def test_a_malformed_expression_would_be_caught():
    with pytest.raises(celpy.CELParseError):
        celpy.Environment().compile("object.spec.containers.exists(c, ")


GPU_PODS = {
    **{f"limit {r}": pod([container(limits={r: "1"})]) for r in GPU_RESOURCES},
    **{f"request {r}": pod([container(requests={r: "1"})]) for r in GPU_RESOURCES},
    "gpu in an init container": pod(init_containers=[container(limits={"nvidia.com/gpu": "1"})]),
    "gpu in the second container": pod(
        [container(limits={"cpu": "1"}), container(limits={"nvidia.com/gpu": "2"})]
    ),
    "ClearML fraction label": pod(labels={"clearml-injector/fraction": "0.25"}),
    "KAI gpu-fraction annotation": pod(annotations={"gpu-fraction": "0.5"}),
    "KAI gpu-memory annotation": pod(annotations={"gpu-memory": "4096"}),
}
OTHER_PODS = {
    **{f"limit {r}": pod([container(limits={r: "1"}, requests={r: "1"})]) for r in OTHER_RESOURCES},
    "no resources": pod(),
    "empty resources": pod([{"name": "c", "image": "busybox:1.36", "resources": {}}]),
    "unrelated labels and annotations": pod(labels={"app": "web"}, annotations={"team": "a"}),
    "cpu-only init container": pod(init_containers=[container(limits={"cpu": "1"})]),
}


@pytest.mark.parametrize("case", sorted(GPU_PODS))
def test_gpu_pods_reach_both_webhooks(case):
    for expression in conditions("base"):
        assert admitted_to_webhook(expression, GPU_PODS[case]), case


@pytest.mark.parametrize("case", sorted(OTHER_PODS))
def test_other_pods_are_admitted_without_a_webhook_call(case):
    for expression in conditions("base"):
        assert not admitted_to_webhook(expression, OTHER_PODS[case]), case


def test_every_resource_the_shipped_catalogue_names_or_suspects_reaches_the_webhooks():
    """The API server's filter and the shipped GPU catalogue agree: every resource it names, a name for
    each of its patterns, and a name for each accelerator pattern (whose pods it denies) are sent."""
    catalogue = load_hardware(ROOT / "deployment" / "base" / "hardware" / "hardware.json").catalogue
    resources = [
        *catalogue.resources,
        *(pattern.replace("*", "1g.5gb") for pattern, _ in catalogue.patterns),
        *(pattern.replace("*", "x") for pattern in catalogue.accelerator_patterns),
        *(f"deviceclass.resource.kubernetes.io/{name}" for name in catalogue.device_classes),
    ]
    pods = [pod([container(limits={r: "1"})]) for r in resources]
    pods += [
        pod(labels={shares.CLEARML_FRACTION_LABEL: "0.5"}),
        pod(annotations={shares.KAI_FRACTION_ANNOTATION: "0.5"}),
        pod(annotations={shares.KAI_MEMORY_ANNOTATION: "2048"}),
    ]
    for gpu_pod in pods:
        for expression in conditions("base"):
            assert admitted_to_webhook(expression, gpu_pod), gpu_pod


def test_a_pod_with_dra_claims_reaches_the_webhooks():
    claiming = pod()
    claiming["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}]
    for expression in conditions("base"):
        assert admitted_to_webhook(expression, claiming)


def conditions_of(build: str, kind: str) -> list[str]:
    return [
        condition["expression"]
        for obj in render(build)
        if obj["kind"] == kind
        for webhook in obj["webhooks"]
        if webhook["name"] in ("mutate.gpu-timekeeper.io", "validate.gpu-timekeeper.io")  # the pod webhooks
        for condition in webhook["matchConditions"]
    ]


OURS = {
    "our annotation": pod(annotations={"gpu-timekeeper.io/gpu-share": "0.000001"}),
    "a container named as our sidecar": pod([{"name": "gpu-timekeeper-sidecar", "image": "busybox:1.36"}]),
    "an init container named as our sidecar": pod(
        init_containers=[{"name": "gpu-timekeeper-sidecar", "image": "busybox:1.36"}]
    ),
    "a volume under our token's name": {
        **pod(),
        "spec": {**pod()["spec"], "volumes": [{"name": "gpu-timekeeper-token", "emptyDir": {}}]},
    },
    "a token for our audience": {
        **pod(),
        "spec": {
            **pod()["spec"],
            "volumes": [
                {
                    "name": "mine",
                    "projected": {"sources": [{"serviceAccountToken": {"audience": "gpu-timekeeper"}}]},
                }
            ],
        },
    },
}


@pytest.mark.parametrize("case", sorted(OURS))
def test_a_pod_carrying_what_is_ours_reaches_both_webhooks(case):
    """A non-GPU pod that claims our annotations, sidecar or token is judged, not stored unseen."""
    for expression in conditions("base"):
        assert admitted_to_webhook(expression, OURS[case]), case


# Issue 25: on 1.30+ an UPDATE that drops the GPU markers with our annotations was never sent to /validate.
UPDATES = {
    "KAI marker and our annotations dropped": (
        pod(annotations={"gpu-fraction": "0.5", "gpu-timekeeper.io/gpu-share": "0.5"}),
        pod(),
    ),
    "ClearML label dropped": (pod(labels={"clearml-injector/fraction": "0.5"}), pod()),
    "our annotations dropped from a GPU pod": (
        pod([container(limits={"nvidia.com/gpu": "1"})], annotations={"gpu-timekeeper.io/gpu-share": "1"}),
        pod([container(limits={"nvidia.com/gpu": "1"})]),
    ),
    "a KAI marker added to a pending pod": (pod(), pod(annotations={"gpu-fraction": "0.5"})),
}


@pytest.mark.parametrize("build", ["base", *CHART_RENDERS])
@pytest.mark.parametrize("case", sorted(UPDATES))
def test_an_update_is_sent_when_either_object_is_ours(build, case):
    old, new = UPDATES[case]
    (expression,) = conditions_of(build, "ValidatingWebhookConfiguration")
    assert admitted_to_webhook(expression, new, old), case


@pytest.mark.parametrize("build", ["base", *CHART_RENDERS])
def test_an_update_of_a_pod_that_never_was_ours_is_not_sent(build):
    (expression,) = conditions_of(build, "ValidatingWebhookConfiguration")
    assert not admitted_to_webhook(expression, pod(labels={"app": "web"}), pod())


def sessions_condition(build: str) -> str:
    (expression,) = [
        condition["expression"]
        for obj in render(build)
        if obj["kind"] == "ValidatingWebhookConfiguration"
        for webhook in obj["webhooks"]
        if webhook["name"] == "sessions.gpu-timekeeper.io"
        for condition in webhook["matchConditions"]
    ]
    return expression


@pytest.mark.parametrize("build", [*BUILDS, *CHART_RENDERS])
@pytest.mark.parametrize("kind", ["PodExecOptions", "PodAttachOptions"])
def test_only_a_session_in_our_sidecar_is_sent_to_the_sessions_webhook(build: str, kind: str) -> None:
    """A 1.30+ API server sends `kubectl exec`/`attach` to /validate only when it names our sidecar: every
    other session (one naming no container included) costs no call."""
    expression = sessions_condition(build)

    def sent(options: dict[str, Any]) -> bool:
        variables = {"object": celpy.json_to_cel({"kind": kind, "apiVersion": "v1", **options})}
        return bool(compiled(expression).evaluate(variables))

    assert sent({"container": "gpu-timekeeper-sidecar", "command": ["cat", "/token"]})
    assert not sent({"container": "main"})
    assert not sent({})


@pytest.mark.parametrize("case", sorted(ROUTE_PODS))
@pytest.mark.parametrize("build", ["base", CHART_RENDERS[0]])
def test_a_pod_using_a_gpu_route_reaches_both_webhooks(build: str, case: str) -> None:
    """Issue 36: a pod asking for no GPU as a resource but for one through the node (gpuaccounting.supply)
    is sent to /validate, which refuses it; so is an ephemeral container that adds one."""
    body = ROUTE_PODS[case][0]
    for expression in conditions(build):
        assert admitted_to_webhook(expression, body), case
    debugged = {**pod(), "spec": {**pod()["spec"], "ephemeralContainers": body["spec"]["containers"]}}
    if route_uses(debugged, DEFAULT_SUPPLY, asks_for_gpu=False):
        for expression in conditions(build):
            assert admitted_to_webhook(expression, debugged, pod()), case


HARDENED_PODS = {
    "restricted security context": pod(
        [
            {
                "name": "c",
                "image": "busybox:1.36",
                "securityContext": {"privileged": False, "capabilities": {"drop": ["ALL"]}},
            }
        ]
    ),
    "ordinary env": pod([{"name": "c", "image": "busybox:1.36", "env": [{"name": "MODE", "value": "x"}]}]),
    "an emptyDir mount": {
        **pod(
            [{"name": "c", "image": "busybox:1.36", "volumeMounts": [{"name": "v", "mountPath": "/data"}]}]
        ),
    },
}


@pytest.mark.parametrize("case", sorted(HARDENED_PODS))
def test_non_gpu_pods_without_a_route_still_never_reach_the_webhooks(case: str) -> None:
    for expression in conditions("base"):
        assert not admitted_to_webhook(expression, HARDENED_PODS[case]), case


@pytest.mark.parametrize("case", sorted(EVASION_PODS))
@pytest.mark.parametrize("build", ["base", CHART_RENDERS[0]])
def test_a_route_spelled_as_the_toolkit_reads_it_reaches_both_webhooks(build: str, case: str) -> None:
    """Every spelling /validate refuses must be sent, or on 1.30+ the pod is never judged."""
    body = EVASION_PODS[case][0]
    assert route_uses(body, DEFAULT_SUPPLY, asks_for_gpu=False)
    for expression in conditions(build):
        assert admitted_to_webhook(expression, body), case
    debugged = {**pod(), "spec": {**pod()["spec"], "ephemeralContainers": body["spec"]["containers"]}}
    if route_uses(debugged, DEFAULT_SUPPLY, asks_for_gpu=False):
        for expression in conditions(build):
            assert admitted_to_webhook(expression, debugged, pod()), case
