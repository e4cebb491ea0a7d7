"""deployment/nodeagent: the node agent's DaemonSet asks for exactly what it needs and nothing more —
hostPID, one read-only hostPath (the kubelet's pod-resources directory), root without capabilities for the
root-owned socket — and may only create TokenReviews. Its image installs only its own extra."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest

from tests.deployment.conftest import one, render
from tests.deployment.test_images_and_compose import final_stage, instructions
from tests.deployment.test_manifests import KUBERNETES_VERSIONS

BUILD = "nodeagent"
NAME = "gpu-timekeeper-nodeagent"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schemas(version: str) -> None:
    for obj in render(BUILD):
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_agent_runs_in_its_own_namespace_and_nothing_else_does() -> None:
    objects = render(BUILD)
    namespace = one(objects, "Namespace", "gpu-timekeeper-node")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    namespaced = [o for o in objects if o["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding")]
    assert {o["kind"] for o in namespaced} == {"DaemonSet", "ServiceAccount", "ResourceQuota"}
    assert {o["metadata"]["namespace"] for o in namespaced} == {"gpu-timekeeper-node"}


def test_the_daemonset_holds_host_pid_and_one_read_only_host_path_and_no_capabilities() -> None:
    spec = one(render(BUILD), "DaemonSet", NAME)["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    assert not spec.get("hostNetwork") and not spec.get("hostIPC")
    assert [v["hostPath"]["path"] for v in spec["volumes"]] == ["/var/lib/kubelet/pod-resources"]
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (container,) = spec["containers"]
    context = container["securityContext"]
    assert context["capabilities"]["drop"] == ["ALL"] and "add" not in context["capabilities"]
    assert context["allowPrivilegeEscalation"] is False and not context.get("privileged")
    assert context["readOnlyRootFilesystem"] is True
    assert [m["readOnly"] for m in container["volumeMounts"]] == [True]
    assert "memory" in container["resources"]["limits"]
    assert container["ports"][0]["hostPort"] == container["ports"][0]["containerPort"] == 9402


def test_the_agent_may_only_review_tokens() -> None:
    objects = render(BUILD)
    role = one(objects, "ClusterRole", NAME)
    assert role["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
    ]
    binding = one(objects, "ClusterRoleBinding", NAME)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": NAME, "namespace": "gpu-timekeeper-node"}
    ]


def test_the_image_installs_only_its_extra_and_runs_what_the_daemonset_runs() -> None:
    steps = instructions("nodeagent")
    assert [a for op, a in steps if op == "RUN" and "pip install" in a] == [
        '/opt/venv/bin/pip install ".[nodeagent]"'
    ]
    copied = {a.split()[0] for op, a in steps if op == "COPY" and not a.startswith("--from")}
    assert {"nodeagent", "gpuaccounting"} <= copied and not copied & {"timekeeper", "webhook", "sidecar"}
    (cmd,) = [json.loads(a) for op, a in final_stage("nodeagent") if op == "CMD"]
    (container,) = one(render(BUILD), "DaemonSet", NAME)["spec"]["template"]["spec"]["containers"]
    assert container["args"] == cmd == ["python", "-m", "nodeagent"]
    assert container["image"] == "ghcr.io/gpu-timekeeper/nodeagent:0.1.0"
