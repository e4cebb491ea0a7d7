"""Exempt classes are exempt only where an admin says, in every install: both servers get one list of
namespaces (kube-system and the install's own by default), and the ResourceQuotas that admit the
system-critical classes where they belong once the API server limits them (upstream's "Limit Priority
Class consumption by default")."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from gpuaccounting.admission_state import DEFAULT_EXEMPT_PRIORITY_CLASSES
from tests.deployment.conftest import INSTALLS, ROOT, find, helm_template, kustomize, one, render
from timekeeper.settings import Settings
from webhook.settings import WebhookSettings

SERVERS = {
    "gpu-timekeeper": ("TIMEKEEPER_", Settings),
    "gpu-timekeeper-webhook": ("WEBHOOK_", WebhookSettings),
}


def exempt_namespaces(objects: tuple[dict[str, Any], ...]) -> dict[str, dict[str, frozenset[str]]]:
    """Each server's setting, read from its Deployment's env by the server's own settings class."""
    found = {}
    for deployment in find(objects, "Deployment"):
        name = deployment["metadata"]["name"]
        if name not in SERVERS:
            continue
        prefix, settings = SERVERS[name]
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        [value] = [e["value"] for e in container["env"] if e["name"] == f"{prefix}EXEMPT_NAMESPACES"]
        found[name] = settings.model_validate({"exempt_namespaces": json.loads(value)}).exempt_namespaces
    return found


@pytest.mark.parametrize("build", INSTALLS)
def test_both_servers_exempt_in_kube_system_and_their_own_namespace_only(build):
    objects = render(build)
    found = exempt_namespaces(objects)
    assert set(found) == set(SERVERS)
    namespace = one(objects, "Deployment", "gpu-timekeeper-webhook")["metadata"]["namespace"]
    assert found["gpu-timekeeper"] == found["gpu-timekeeper-webhook"] == {"*": {"kube-system", namespace}}


def test_the_chart_value_feeds_both_servers():
    listed = {"*": ["kube-system"], "infra-critical": ["ops", "kube-system"]}
    objects = helm_template("--set-json", f"priorityClasses.exemptNamespaces={json.dumps(listed)}")
    expected = {key: frozenset(value) for key, value in listed.items()}
    assert exempt_namespaces(objects) == {name: expected for name in SERVERS}


def critical_quotas(objects: tuple[dict[str, Any], ...]) -> dict[str, list[str]]:
    """Namespace -> the PriorityClasses a quota there covers (a quota with no `hard` counts nothing)."""
    covered = {}
    for quota in find(objects, "ResourceQuota"):
        assert "hard" not in quota["spec"]
        [expression] = quota["spec"]["scopeSelector"]["matchExpressions"]
        assert (expression["scopeName"], expression["operator"]) == ("PriorityClass", "In")
        covered[quota["metadata"]["namespace"]] = expression["values"]
    return covered


COVERED = {"kube-system": list(DEFAULT_EXEMPT_PRIORITY_CLASSES)}


def test_the_component_covers_the_system_critical_classes_in_kube_system():
    assert critical_quotas(render("components/critical-classes-quota")) == COVERED


def test_in_an_overlay_the_documented_transformer_keeps_it_in_kube_system(tmp_path: Path):
    """docs/deployment.md's overlay, built: `namespace:` would move the quota into ours."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    [overlay] = re.findall(r"```yaml\n(# my-overlay/kustomization.yaml\n.*?)```", text, re.S)
    overlay = overlay.replace("../deployment/", os.path.relpath(ROOT / "deployment", tmp_path) + "/")
    (tmp_path / "kustomization.yaml").write_text(overlay)
    objects = kustomize(tmp_path)
    assert critical_quotas(objects) == COVERED
    assert one(objects, "Deployment", "gpu-timekeeper")["metadata"]["namespace"] == "gpu-timekeeper"


def test_the_chart_renders_it_when_told_and_not_by_default():
    assert critical_quotas(helm_template("--set", "priorityClasses.criticalClassesQuota=true")) == COVERED
    assert critical_quotas(helm_template()) == {}


@pytest.mark.parametrize("build", ["nodeagent", "helm"])
def test_the_node_agent_is_covered_at_the_class_it_runs_at(build):
    objects = render(build) if build == "nodeagent" else helm_template("--set", "nodeAgent.enabled=true")
    [daemonset] = find(objects, "DaemonSet")
    namespace = daemonset["metadata"]["namespace"]
    assert critical_quotas(objects)[namespace] == [daemonset["spec"]["template"]["spec"]["priorityClassName"]]


def test_the_documented_admission_configuration_limits_the_covered_classes():
    """docs/deployment.md's AdmissionConfiguration names exactly the classes the quota covers."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    [values] = re.findall(r"kind: ResourceQuotaConfiguration.*?values: (\[[^\]]*\])", text, re.S)
    assert json.loads(values) == list(DEFAULT_EXEMPT_PRIORITY_CLASSES)
