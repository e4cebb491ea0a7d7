"""A fleet's installs (docs/fleet.md): a hub is the single-cluster install plus its members' kubeconfig
Secrets mounted read-only and named in TIMEKEEPER_MEMBERS; a member is the webhook polling the hub with
its cluster's name, the GPUBudget CRD (the hub syncs its objects), and the access the hub's credentials
need there (the timekeeper's own ClusterRole less GPUBudgetDefaults, and system:auth-delegator, through a
token Secret), with no timekeeper, database or GPUBudgetDefault CRD. The chart and kustomize render the
same objects for both; the single-cluster install names no fleet at all."""

from __future__ import annotations

import copy
import os
import textwrap
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.deployment.conftest import DEPLOYMENT, find, helm, helm_template, kustomize, one, pod_specs
from tests.deployment.test_chart import CHART, _normalised, env_of
from tests.deployment.test_manifests import KUBERNETES_VERSIONS, OPERATOR_KINDS
from timekeeper.settings import Settings
from webhook.settings import WebhookSettings

HUB_URL = "https://gpu-timekeeper.hub.example.com"
MEMBER = ("--set", f"fleet.cluster=b,fleet.hubUrl={HUB_URL},certificates.source=certManager")
HUB = ("--set", "fleet.members.b.secretName=gpu-timekeeper-member-b")
# What only a hub (or a single cluster) has: the timekeeper, its database and migration, the default's CRD.
HUB_ONLY = {
    ("Deployment", "gpu-timekeeper"),
    ("Service", "gpu-timekeeper"),
    ("PodDisruptionBudget", "gpu-timekeeper"),
    ("Job", "gpu-timekeeper-migrate"),
    ("NetworkPolicy", "gpu-timekeeper"),
    ("CustomResourceDefinition", "gpubudgetdefaults.gpu-timekeeper.io"),
}
BUDGETS_CRD = ("CustomResourceDefinition", "gpubudgets.gpu-timekeeper.io")


def overlay(tmp_path: Path, resource: str, *components: str, patch: str | None = None) -> Path:
    """A kustomization of deployment/<resource> with deployment/<components>, as a user writes one."""
    lines = [
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "namespace: gpu-timekeeper",
        f"resources: [{os.path.relpath(DEPLOYMENT / resource, tmp_path)}]",
        f"components: [{', '.join(os.path.relpath(DEPLOYMENT / c, tmp_path) for c in components)}]",
    ]
    if patch:
        lines.append("patches:\n  - path: patch.yaml")
        (tmp_path / "patch.yaml").write_text(textwrap.dedent(patch))
    (tmp_path / "kustomization.yaml").write_text("\n".join(lines) + "\n")
    return tmp_path


# The member overlay docs/fleet.md shows: cert-manager, and the two values set.
MEMBER_PATCH = f"""\
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: gpu-timekeeper-webhook
      namespace: gpu-timekeeper
    spec:
      template:
        spec:
          containers:
            - name: webhook
              env:
                - name: WEBHOOK_TIMEKEEPER_URL
                  value: {HUB_URL}
                - name: WEBHOOK_CLUSTER
                  value: b
    """


def kustomized_member(tmp_path: Path) -> tuple[dict[str, Any], ...]:
    return kustomize(overlay(tmp_path, "member", "components/certmanager", patch=MEMBER_PATCH))


def keyed(objects: tuple[dict[str, Any], ...]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def webhook_env(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    deployment = one(objects, "Deployment", "gpu-timekeeper-webhook")
    return env_of(deployment["spec"]["template"]["spec"]["containers"][0])


def by_name(obj: dict[str, Any]) -> dict[str, Any]:
    """The object with its pods' env, mounts and volumes in name order: a patch appends where a template
    inserts, and the order means nothing to Kubernetes."""
    obj = copy.deepcopy(obj)
    for _, spec in pod_specs((obj,)):
        spec["volumes"] = sorted(spec.get("volumes", []), key=lambda v: v["name"])
        for container in spec["containers"]:
            for field in ("env", "volumeMounts"):
                container[field] = sorted(container.get(field, []), key=lambda e: e["name"])
    return obj


@pytest.mark.parametrize("install", ["chart", "kustomize"])
def test_a_member_runs_the_webhook_against_the_hub_and_no_timekeeper(install, tmp_path):
    objects = helm_template(*MEMBER) if install == "chart" else kustomized_member(tmp_path)
    assert not HUB_ONLY & set(keyed(objects))
    assert not find(objects, "StatefulSet") and not find(objects, "Secret", "gpu-timekeeper-database")
    env = webhook_env(objects)
    assert env["WEBHOOK_TIMEKEEPER_URL"] == HUB_URL
    settings = WebhookSettings(cluster=env["WEBHOOK_CLUSTER"], timekeeper_url=env["WEBHOOK_TIMEKEEPER_URL"])
    assert settings.cluster == "b"
    for obj in objects:
        if obj["kind"] in OPERATOR_KINDS:
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSIONS[-1], strict=True)


def without_defaults(role: dict[str, Any]) -> list[dict[str, Any]]:
    """A ClusterRole's rules less any right on GPUBudgetDefaults (and rules left with no resource)."""
    rules = []
    for rule in role["rules"]:
        resources = [r for r in rule["resources"] if not r.startswith("gpubudgetdefaults")]
        if resources:
            rules.append(rule | {"resources": resources})
    return rules


@pytest.mark.parametrize("install", ["chart", "kustomize"])
def test_the_hubs_credentials_in_a_member_are_the_timekeepers_own_access(install, tmp_path):
    """TokenReview and SubjectAccessReview (system:auth-delegator), and the timekeeper's ClusterRole as
    the single-cluster install has it (pods, nodes, what the reconciler reads) less GPUBudgetDefaults, for
    the ServiceAccount whose token Secret the hub's kubeconfig carries; the member's webhook may read its
    cluster's budgets at the hub (the hub asks this cluster's API server whether it may)."""
    objects = helm_template(*MEMBER) if install == "chart" else kustomized_member(tmp_path)
    single = helm_template() if install == "chart" else kustomize(DEPLOYMENT / "base")
    token = one(objects, "Secret", "gpu-timekeeper-hub-token")
    assert token["type"] == "kubernetes.io/service-account-token"
    account = token["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    assert account == "gpu-timekeeper"
    subject = {"kind": "ServiceAccount", "name": account, "namespace": "gpu-timekeeper"}
    roles = {b["roleRef"]["name"] for b in find(objects, "ClusterRoleBinding") if subject in b["subjects"]}
    assert roles == {"gpu-timekeeper", "system:auth-delegator"}
    member_role, single_role = (
        one(objects, "ClusterRole", "gpu-timekeeper"),
        one(single, "ClusterRole", "gpu-timekeeper"),
    )
    assert member_role["rules"] == without_defaults(single_role)
    assert member_role["metadata"] == single_role["metadata"]
    rules = member_role["rules"]
    assert {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]} in rules
    assert any("pods" in r["resources"] and "get" in r["verbs"] for r in rules)
    webhook = {"kind": "ServiceAccount", "name": "gpu-timekeeper-webhook", "namespace": "gpu-timekeeper"}
    viewer = one(objects, "ClusterRoleBinding", "gpu-timekeeper-webhook-viewer")
    assert viewer["roleRef"]["name"] == "gpu-timekeeper-viewer" and viewer["subjects"] == [webhook]
    # The roles the hub's SubjectAccessReviews ask about, aggregated into view/edit/admin as at home.
    assert one(objects, "ClusterRole", "gpu-timekeeper-viewer") == one(
        single, "ClusterRole", "gpu-timekeeper-viewer"
    )


def test_the_chart_renders_a_member_as_kustomize_does(tmp_path):
    kustomized = keyed(kustomized_member(tmp_path))
    chart = keyed(helm_template(*MEMBER))
    assert set(chart) == set(kustomized) - {("Namespace", "gpu-timekeeper")}
    differing = [
        key
        for key, expected in kustomized.items()
        if key in chart
        and _normalised(by_name(chart[key])) != _normalised(by_name(expected))
        # The chart's own webhook env (priority classes, pull policy) is checked by test_chart.py.
        and key != ("Deployment", "gpu-timekeeper-webhook")
    ]
    assert not differing, f"the chart's member differs from deployment/member's: {differing}"
    chart_env = webhook_env(tuple(chart.values()))
    assert webhook_env(tuple(kustomized.values())).items() <= chart_env.items()


def timekeeper_pod(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return dict(one(objects, "Deployment", "gpu-timekeeper")["spec"]["template"]["spec"])


@pytest.mark.parametrize("install", ["chart", "kustomize"])
def test_a_hub_mounts_each_members_kubeconfig_secret_read_only_where_its_settings_look(
    install, tmp_path, monkeypatch
):
    if install == "chart":
        objects = helm_template(*HUB)
    else:
        objects = kustomize(overlay(tmp_path, "overlays/production", "components/fleet-hub"))
    spec = timekeeper_pod(objects)
    container = spec["containers"][0]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "members"]
    assert mount["readOnly"] is True
    (volume,) = [v for v in spec["volumes"] if v["name"] == "members"]
    files = {
        f"{mount['mountPath']}/{item['path']}": (source["secret"]["name"], item["key"])
        for source in volume["projected"]["sources"]
        for item in source["secret"]["items"]
    }
    monkeypatch.setenv("TIMEKEEPER_AUTH_MODE", "kubernetes")
    monkeypatch.setenv("TIMEKEEPER_MEMBERS", env_of(container)["TIMEKEEPER_MEMBERS"])
    members = Settings().members
    assert set(members) == {"b"}
    assert files[str(members["b"].kubeconfig)] == ("gpu-timekeeper-member-b", "kubeconfig")
    # The rest is the single-cluster install's: a hub is one, serving members beside its own cluster.
    assert env_of(container)["TIMEKEEPER_AUTH_MODE"] == "kubernetes"


def test_the_chart_renders_a_hub_as_kustomize_does(tmp_path):
    production = CHART / "ci" / "production-values.yaml"
    kustomized = kustomize(overlay(tmp_path, "overlays/production", "components/fleet-hub"))
    chart = helm_template(*HUB, values=production)
    expected = _normalised(by_name(one(kustomized, "Deployment", "gpu-timekeeper")))
    assert _normalised(by_name(one(chart, "Deployment", "gpu-timekeeper"))) == expected


def test_a_members_context_and_key_reach_the_timekeeper(monkeypatch):
    objects = helm_template(
        "--set",
        "fleet.members.eu-c.secretName=kc-eu-c,fleet.members.eu-c.key=config,fleet.members.eu-c.context=admin",
    )
    container = timekeeper_pod(objects)["containers"][0]
    monkeypatch.setenv("TIMEKEEPER_AUTH_MODE", "kubernetes")
    monkeypatch.setenv("TIMEKEEPER_MEMBERS", env_of(container)["TIMEKEEPER_MEMBERS"])
    member = Settings().members["eu-c"]
    assert (str(member.kubeconfig), member.context) == (
        "/etc/gpu-timekeeper/members/eu-c/kubeconfig",
        "admin",
    )
    (volume,) = [v for v in timekeeper_pod(objects)["volumes"] if v["name"] == "members"]
    assert volume["projected"]["sources"] == [
        {"secret": {"name": "kc-eu-c", "items": [{"key": "config", "path": "eu-c/kubeconfig"}]}}
    ]


def test_a_single_cluster_names_no_fleet():
    """The default install is the one before fleets: no members, no cluster, no hub token."""
    objects = helm_template()
    assert "TIMEKEEPER_MEMBERS" not in env_of(timekeeper_pod(objects)["containers"][0])
    assert "WEBHOOK_CLUSTER" not in webhook_env(objects)
    assert not find(objects, "Secret", "gpu-timekeeper-hub-token")
    assert set(keyed(objects)) >= HUB_ONLY
    base = kustomize(DEPLOYMENT / "base")
    assert "WEBHOOK_CLUSTER" not in webhook_env(base)
    assert "TIMEKEEPER_MEMBERS" not in env_of(timekeeper_pod(base)["containers"][0])


def test_a_members_prometheus_gets_the_webhooks_alerts_only():
    """Its Prometheus scrapes no timekeeper: the timekeeper's alerts would fire there for ever. The
    stale-state alert is the one that says the hub cannot be reached."""
    objects = helm_template(
        *MEMBER, "--set", "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true"
    )
    assert [m["metadata"]["name"] for m in find(objects, "ServiceMonitor")] == ["gpu-timekeeper-webhook"]
    assert not find(objects, "ServiceAccount", "gpu-timekeeper-metrics")
    (rule,) = find(objects, "PrometheusRule")
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert "GPUTimekeeperWebhookStateStale" in alerts and "GPUTimekeeperDown" not in alerts
    assert all("webhook" in r["expr"] for r in alerts.values())
    assert "hub" in alerts["GPUTimekeeperWebhookStateStale"]["annotations"]["description"]


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("fleet.cluster=b", "fleet.cluster needs fleet.hubUrl"),
        (f"fleet.hubUrl={HUB_URL}", "fleet.hubUrl is a member's setting"),
        (f"fleet.cluster=b,fleet.hubUrl={HUB_URL},fleet.members.c.secretName=s", "exclude each other"),
        (f"fleet.cluster=Team_B,fleet.hubUrl={HUB_URL}", "/fleet/cluster"),
        ("fleet.members.B.secretName=s", "invalid propertyName 'B'"),
        ("fleet.members.b.key=kubeconfig", "secretName"),
        ("fleet.cluster=b,fleet.hubUrl=hub:8080", "/fleet/hubUrl"),
    ],
)
def test_fleet_values_that_cannot_work_are_refused(setting, complaint):
    done = helm("template", "x", str(CHART), "--set", setting, check=False)
    assert done.returncode != 0
    assert complaint in done.stderr, done.stderr


def test_the_shipped_member_kustomization_reaches_no_hub_until_its_overlay_names_one():
    """deployment/member as shipped names a hub that cannot resolve (.invalid) and a placeholder cluster:
    applied without its overlay, its webhook polls nothing and says so (GPUTimekeeperWebhookStateStale)."""
    env = webhook_env(kustomize(DEPLOYMENT / "member"))
    assert env["WEBHOOK_TIMEKEEPER_URL"].endswith(".invalid")
    assert env["WEBHOOK_CLUSTER"] == "change-me"


@pytest.mark.parametrize("install", ["chart", "kustomize"])
def test_a_member_serves_gpubudgets_for_its_hub_to_sync_and_no_default(install, tmp_path):
    """The GPUBudget CRD as a single cluster has it (the chart's kept on uninstall); the hub's credentials
    list and watch GPUBudgets and update their status, never their spec, and nothing of GPUBudgetDefaults
    (a member's default is the hub's)."""
    objects = helm_template(*MEMBER) if install == "chart" else kustomized_member(tmp_path)
    single = helm_template() if install == "chart" else kustomize(DEPLOYMENT / "base")
    assert keyed(objects)[BUDGETS_CRD] == keyed(single)[BUDGETS_CRD]
    assert not find(objects, "CustomResourceDefinition", "gpubudgetdefaults.gpu-timekeeper.io")
    rules = one(objects, "ClusterRole", "gpu-timekeeper")["rules"]
    ours = [r for r in rules if r["apiGroups"] == ["gpu-timekeeper.io"]]
    assert ours == [
        {"apiGroups": ["gpu-timekeeper.io"], "resources": ["gpubudgets"], "verbs": ["list", "watch"]},
        {"apiGroups": ["gpu-timekeeper.io"], "resources": ["gpubudgets/status"], "verbs": ["update"]},
    ]
