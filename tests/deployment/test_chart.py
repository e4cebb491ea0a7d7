"""The Helm chart: lint, schema, documented values, packaging, its choices (certificates, database,
monitoring, priority classes), and the same objects as the kustomize production overlay.

The invariants every install must keep (probes, PDBs, RBAC, webhook scope, pinned images...) are checked
on the chart's renderings by test_manifests.py, beside the kustomize builds.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import tarfile
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpuaccounting.catalogue import GpuEntry, SharingSystem
from gpuaccounting.hardware import parse_hardware
from tests.deployment.conftest import (
    CHART,
    CHART_VALUES,
    DEPLOYMENT,
    ROOT,
    find,
    helm,
    helm_template,
    kustomize,
    one,
    pod_specs,
)
from tests.deployment.test_manifests import KUBERNETES_VERSIONS
from webhook.settings import WebhookSettings

PRODUCTION_VALUES = CHART_VALUES["production"]
# Labels that carry meaning beyond Helm's bookkeeping: role aggregation, Pod Security levels.
KEPT_LABELS = ("rbac.authorization.k8s.io/", "pod-security.kubernetes.io/")
# Env the chart gives the webhook beyond the overlay's: the priority classes it creates (one value feeds
# both) and the sidecar's pull policy (image.pullPolicy).
CHART_ONLY_WEBHOOK_ENV = {
    f"WEBHOOK_{prefix}_{suffix}"
    for prefix in ("IN_BUDGET", "OVER_BUDGET")
    for suffix in ("PRIORITY_CLASS", "PRIORITY", "PREEMPTION_POLICY")
} | {"WEBHOOK_SIDECAR_IMAGE_PULL_POLICY"}


def _chart_docs() -> Any:
    spec = importlib.util.spec_from_file_location("chart_docs", DEPLOYMENT / "helm" / "chart_docs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.mark.parametrize("values", CHART_VALUES)
def test_helm_lint_passes_strictly(values):
    file = CHART_VALUES[values]
    helm("lint", "--strict", str(CHART), *(["--values", str(file)] if file else []))


def test_chart_and_app_version_are_the_project_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["version"] == chart["appVersion"] == version


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("timekeeper.replica=3", "additional properties 'replica' not allowed"),
        ("webhook.replicas=1", "/webhook/replicas"),
        ("image.tag=latest", "/image/tag"),
        ("database.mode=sqlite", "/database/mode"),
        ("certificates.source=vault", "/certificates/source"),
        ("priorityClasses.overBudget.preemptionPolicy=Sometimes", "/priorityClasses/overBudget"),
    ],
)
def test_the_values_schema_refuses_typos_and_unsafe_values(setting, complaint):
    done = helm("template", "x", str(CHART), "--set", setting, check=False)
    assert done.returncode != 0
    assert complaint in done.stderr


def test_every_value_is_documented_and_the_readme_table_is_current():
    chart_docs = _chart_docs()
    readme = (CHART / "README.md").read_text()
    values_text = (CHART / "values.yaml").read_text()
    assert chart_docs.rendered_readme(readme, values_text) == readme, "run `make chart-docs`"
    for key in ("database.mode", "priorityClasses.inBudget.value", "monitoring.serviceMonitor.enabled"):
        assert f"| `{key}` |" in readme


def test_a_value_without_a_description_is_refused():
    values_text = (CHART / "values.yaml").read_text() + "\ntimekeeper2:\n  replicas: 2\n"
    with pytest.raises(ValueError, match=r"timekeeper2\.replicas"):
        _chart_docs().table(values_text)


def test_the_chart_packages_with_the_shared_files_inside(tmp_path):
    helm("package", str(CHART), "--destination", str(tmp_path))
    (package,) = tmp_path.glob("gpu-timekeeper-*.tgz")
    with tarfile.open(package) as archive:
        rule = archive.extractfile("gpu-timekeeper/files/prometheusrule.yaml")
        assert rule is not None
        assert rule.read() == (DEPLOYMENT / "components/prometheus/prometheusrule.yaml").read_bytes()
    assert helm_template(values=PRODUCTION_VALUES, chart=package) == helm_template(values=PRODUCTION_VALUES)


def test_the_files_the_chart_shares_are_links_into_the_kustomize_tree():
    """One source: the chart reads the base's RBAC and webhook rules and the monitoring component."""
    shared = sorted((CHART / "files").iterdir())
    assert shared
    for path in shared:
        assert path.is_symlink(), f"{path.name} must link to deployment/, not copy it"
        target = path.resolve()
        assert target.is_relative_to(DEPLOYMENT) and not target.is_relative_to(DEPLOYMENT / "helm")


def _normalised(obj: dict[str, Any]) -> dict[str, Any]:
    """The object less what legitimately differs between the two installs: Helm's labels and hooks and
    the selectors built from them, the pull policy the chart makes a value, and the checksums that roll
    the chart's pods when a ConfigMap they read changes."""
    obj = copy.deepcopy(obj)
    metadata = obj.pop("metadata")
    kept_labels = {k: v for k, v in metadata.get("labels", {}).items() if k.startswith(KEPT_LABELS)}
    kept_annotations = {
        k: v for k, v in metadata.get("annotations", {}).items() if k.startswith("cert-manager.io")
    }
    obj["metadata"] = {
        "name": metadata["name"],
        "namespace": metadata.get("namespace"),
        "labels": kept_labels,
        "annotations": kept_annotations,
    }

    def scrub(node: Any) -> Any:
        if isinstance(node, dict):
            if isinstance(node.get("metadata"), dict) and node is not obj:
                node["metadata"].pop("labels", None)
                annotations = node["metadata"].pop("annotations", {})
                if kept := {k: v for k, v in annotations.items() if not k.startswith("checksum/")}:
                    node["metadata"]["annotations"] = kept
            for key in ("selector", "labelSelector", "podSelector", "imagePullPolicy"):
                node.pop(key, None)
            for value in node.values():
                scrub(value)
        elif isinstance(node, list):
            for value in node:
                scrub(value)
        return node

    return scrub(obj)


def _production_with_monitoring(tmp_path: Path) -> tuple[dict[str, Any], ...]:
    """The production overlay plus components/prometheus, as a kustomize user adds it (kustomize takes
    relative paths only)."""
    (tmp_path / "kustomization.yaml").write_text(
        textwrap.dedent(f"""\
            apiVersion: kustomize.config.k8s.io/v1beta1
            kind: Kustomization
            namespace: gpu-timekeeper
            resources:
              - {os.path.relpath(DEPLOYMENT / "overlays/production", tmp_path)}
            components:
              - {os.path.relpath(DEPLOYMENT / "components/prometheus", tmp_path)}
            """)
    )
    return kustomize(tmp_path)


def test_the_chart_renders_what_the_production_overlay_renders(tmp_path):
    """Same objects, same fields: a change to deployment/ that the chart does not follow fails here."""
    overlay = {(o["kind"], o["metadata"]["name"]): o for o in _production_with_monitoring(tmp_path)}
    chart = {(o["kind"], o["metadata"]["name"]): o for o in helm_template(values=PRODUCTION_VALUES)}
    # Helm installs into a namespace that exists (the chart's README says how to label it).
    assert set(chart) == set(overlay) - {("Namespace", "gpu-timekeeper")}
    differing = []
    for key, expected in overlay.items():
        if key not in chart:
            continue
        actual = copy.deepcopy(chart[key])
        for _, spec in pod_specs((actual,)):
            for container in spec["containers"]:
                if "env" in container:
                    container["env"] = [
                        e for e in container["env"] if e["name"] not in CHART_ONLY_WEBHOOK_ENV
                    ]
        if _normalised(actual) != _normalised(expected):
            differing.append(key)
    assert not differing, f"the chart's objects differ from the production overlay's: {differing}"


def test_the_drift_check_sees_a_changed_field(tmp_path):
    overlay = {(o["kind"], o["metadata"]["name"]): o for o in _production_with_monitoring(tmp_path)}
    changed = copy.deepcopy(overlay[("ClusterRole", "gpu-timekeeper")])
    changed["rules"][0]["verbs"].append("delete")
    assert _normalised(changed) != _normalised(overlay[("ClusterRole", "gpu-timekeeper")])


def test_one_value_feeds_each_priority_class_and_the_webhook():
    """The API server refuses a pod whose priority differs from its class's value: they cannot differ."""
    objects = helm_template(
        "--set",
        "priorityClasses.inBudget.name=team-gpu-high,priorityClasses.inBudget.value=5000",
        "--set",
        "priorityClasses.overBudget.value=10",
    )
    env = env_of(
        one(objects, "Deployment", "gpu-timekeeper-webhook")["spec"]["template"]["spec"]["containers"][0]
    )
    settings = WebhookSettings.model_validate(
        {
            name.removeprefix("WEBHOOK_").lower(): value
            for name, value in env.items()
            # A path inside the pod; JSON (test_exemptions reads it as the server does).
            if isinstance(value, str) and name not in ("WEBHOOK_HARDWARE_FILE", "WEBHOOK_EXEMPT_NAMESPACES")
        }
    )
    for prefix, name in (("in_budget", "team-gpu-high"), ("over_budget", "gpu-over-budget")):
        priority_class = one(objects, "PriorityClass", name)
        assert getattr(settings, f"{prefix}_priority_class") == name
        assert getattr(settings, f"{prefix}_priority") == priority_class["value"]
        assert getattr(settings, f"{prefix}_preemption_policy") == priority_class["preemptionPolicy"]
    assert one(objects, "PriorityClass", "team-gpu-high")["value"] == 5000


def test_an_in_budget_class_below_the_reduced_one_is_refused():
    done = helm("template", "x", str(CHART), "--set", "priorityClasses.inBudget.value=50", check=False)
    assert done.returncode != 0 and "must be above" in done.stderr


def test_monitoring_is_rendered_only_where_the_prometheus_operator_is_installed():
    with_operator = helm_template(values=PRODUCTION_VALUES)
    assert len(find(with_operator, "ServiceMonitor")) == 2
    assert find(with_operator, "PrometheusRule")
    without = helm_template(values=PRODUCTION_VALUES, apis=("cert-manager.io/v1/Certificate",))
    assert not find(without, "ServiceMonitor") and not find(without, "PrometheusRule")
    # The dashboard is a plain ConfigMap: Grafana's sidecar needs no CRD.
    assert one(without, "ConfigMap", "gpu-timekeeper-dashboard")
    assert not find(helm_template(), "ServiceMonitor")
    assert not find(helm_template(), "ConfigMap", "gpu-timekeeper-dashboard")


@pytest.mark.parametrize("install", ["chart", "kustomize"])
def test_each_service_monitor_scrapes_the_server_its_job_label_names(install, tmp_path):
    """The drift check leaves selectors out (Helm's differ): here each ServiceMonitor must select exactly
    one Service of the release, whose pods are the server its `job` label names, on a port that Service
    has, and the webhook's TLS must name that Service and trust the CA the webhook serves with."""
    if install == "chart":
        objects = helm_template(values=PRODUCTION_VALUES)
    else:
        objects = _production_with_monitoring(tmp_path)
    deployments = {d["metadata"]["name"]: d for d in find(objects, "Deployment")}
    jobs = {"gpu-timekeeper": "gpu-timekeeper", "gpu-timekeeper-webhook": "gpu-timekeeper-webhook"}
    monitors = find(objects, "ServiceMonitor")
    assert len(monitors) == 2
    for monitor in monitors:
        (endpoint,) = monitor["spec"]["endpoints"]
        (relabel,) = endpoint["relabelings"]
        deployment = deployments[jobs[relabel["replacement"]]]
        wanted = monitor["spec"]["selector"]["matchLabels"].items()
        (service,) = [
            s for s in find(objects, "Service") if wanted <= s["metadata"].get("labels", {}).items()
        ]
        assert service["metadata"]["namespace"] == monitor["metadata"]["namespace"] == "gpu-timekeeper"
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items(), service["metadata"]["name"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert endpoint["path"] == "/metrics" and endpoint["honorLabels"] is True
        if endpoint.get("scheme") == "https":
            tls = endpoint["tlsConfig"]
            assert tls["serverName"] == f"{service['metadata']['name']}.gpu-timekeeper.svc"
            volumes = deployment["spec"]["template"]["spec"]["volumes"]
            assert tls["ca"]["secret"]["name"] in {v.get("secret", {}).get("secretName") for v in volumes}


def test_the_webhook_is_scraped_over_tls_with_its_own_ca():
    (monitor,) = [
        m
        for m in helm_template(
            "--set", "monitoring.serviceMonitor.enabled=true", "--set", "fullnameOverride=tk"
        )
        if m["kind"] == "ServiceMonitor" and m["metadata"]["name"] == "tk-webhook"
    ]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["serverName"] == "tk-webhook.gpu-timekeeper.svc"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "tk-webhook-tls", "key": "ca.crt"}


def _hook(job: dict[str, Any]) -> list[str]:
    return job["metadata"]["annotations"]["helm.sh/hook"].split(",")


@pytest.mark.parametrize(
    ("mode", "first_migration"),
    [("bundled", "post-install"), ("cloudnativepg", "post-install"), ("external", "pre-install")],
)
def test_migrations_run_before_every_upgrade_and_once_the_database_exists(mode, first_migration):
    job = one(helm_template("--set", f"database.mode={mode}"), "Job", "gpu-timekeeper-migrate")
    assert sorted(_hook(job)) == sorted([first_migration, "pre-upgrade"])
    assert "before-hook-creation" in job["metadata"]["annotations"]["helm.sh/hook-delete-policy"]


def test_each_database_mode_points_the_timekeeper_at_its_database():
    bundled = helm_template()
    assert one(bundled, "StatefulSet", "gpu-timekeeper-postgres")
    url = one(bundled, "Secret", "gpu-timekeeper-database")["stringData"]["url"]
    assert url == "postgresql+psycopg://timekeeper@gpu-timekeeper-postgres:5432/timekeeper"
    policy = one(bundled, "NetworkPolicy", "gpu-timekeeper-postgres")
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": 5432}]

    external = helm_template(
        "--set", "database.mode=external,database.external.secretName=db,database.external.secretKey=dsn"
    )
    assert not find(external, "StatefulSet") and not find(external, "Secret")
    container = one(external, "Deployment", "gpu-timekeeper")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(container)["TIMEKEEPER_DATABASE_URL"] == {"secretKeyRef": {"name": "db", "key": "dsn"}}

    ha = helm_template(values=CHART_VALUES["cloudnativepg"])
    cluster = one(ha, "Cluster", "gpu-timekeeper-postgres")
    assert cluster["spec"]["instances"] == 3
    assert cluster["spec"]["bootstrap"]["initdb"] == {"database": "timekeeper", "owner": "timekeeper"}
    assert cluster["spec"]["affinity"]["podAntiAffinityType"] == "required"
    assert not find(ha, "StatefulSet")


def test_self_signed_certificates_are_made_after_each_release_and_renewed_by_the_same_pod():
    objects = helm_template()
    job = one(objects, "Job", "gpu-timekeeper-certbootstrap")
    cronjob = one(objects, "CronJob", "gpu-timekeeper-certbootstrap")
    assert sorted(_hook(job)) == ["post-install", "post-upgrade"]
    assert cronjob["spec"]["jobTemplate"]["spec"]["template"] == job["spec"]["template"]
    assert not find(objects, "Certificate")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert "annotations" not in one(objects, kind, "gpu-timekeeper")["metadata"]


def test_cert_manager_can_use_the_clusters_own_issuer():
    objects = helm_template(values=CHART_VALUES["cloudnativepg"])
    assert not find(objects, "Issuer")
    issuer = one(objects, "Certificate", "gpu-timekeeper-webhook")["spec"]["issuerRef"]
    assert issuer == {"kind": "ClusterIssuer", "name": "cluster-ca"}


def test_another_release_name_renames_every_reference():
    objects = helm_template(
        "--set", "fullnameOverride=gtk", "--set", "webhook.excludedNamespaces={batch-system}"
    )
    webhook = one(objects, "MutatingWebhookConfiguration", "gtk")["webhooks"][0]
    assert webhook["clientConfig"]["service"]["name"] == "gtk-webhook"
    (expression,) = webhook["namespaceSelector"]["matchExpressions"]
    assert expression["values"] == ["kube-system", "kube-node-lease", "gpu-timekeeper", "batch-system"]
    container = one(objects, "Deployment", "gtk-webhook")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(container)["WEBHOOK_TIMEKEEPER_URL"] == "http://gtk.gpu-timekeeper.svc:8080"
    args = one(objects, "Job", "gtk-certbootstrap")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--restart-deployment=gtk-webhook" in args and "--tls-secret=gtk-webhook-tls" in args
    assert one(objects, "Secret", "gtk-database")["stringData"]["url"].endswith(
        "@gtk-postgres:5432/timekeeper"
    )


def test_network_policies_open_only_the_serving_ports():
    objects = helm_template("--set", "networkPolicy.enabled=true")
    ports = {
        p["metadata"]["name"]: p["spec"]["ingress"][0]["ports"]
        for p in find(objects, "NetworkPolicy")
        if p["metadata"]["name"] != "gpu-timekeeper-postgres"
    }
    assert ports == {
        "gpu-timekeeper": [{"port": "http", "protocol": "TCP"}],
        "gpu-timekeeper-webhook": [{"port": "https", "protocol": "TCP"}],
    }


def test_the_node_agent_is_deployment_nodeagent_in_its_own_namespace():
    """Opt-in; the same objects and fields as `kubectl apply -k deployment/nodeagent`."""
    assert not [o for o in helm_template() if o["metadata"].get("namespace") == "gpu-timekeeper-node"]
    objects = helm_template("--set", "nodeAgent.enabled=true")
    chart = {(o["kind"], o["metadata"]["name"]): o for o in objects if "nodeagent" in o["metadata"]["name"]}
    chart[("Namespace", "gpu-timekeeper-node")] = one(objects, "Namespace", "gpu-timekeeper-node")
    kustomized = {(o["kind"], o["metadata"]["name"]): o for o in kustomize(DEPLOYMENT / "nodeagent")}
    assert set(chart) == set(kustomized)
    for key, expected in kustomized.items():
        assert _normalised(chart[key]) == _normalised(expected), key
    for obj in chart.values():
        kubernetes_validate.validate(obj, KUBERNETES_VERSIONS[-1], strict=True)


def test_clusters_older_than_1_30_are_refused():
    """matchConditions, which keep every non-GPU pod away from the webhook, are GA from 1.30."""
    assert helm_template("--kube-version", "1.30.0")
    done = helm("template", "x", str(CHART), "--kube-version", "1.29.9", check=False)
    assert done.returncode != 0 and "kubeVersion" in done.stderr


def test_a_changed_hardware_value_rolls_both_servers():
    def checksums(*args: str) -> set[str]:
        objects = helm_template(*args)
        return {
            one(objects, "Deployment", name)["spec"]["template"]["metadata"]["annotations"][
                "checksum/hardware"
            ]
            for name in ("gpu-timekeeper", "gpu-timekeeper-webhook")
        }

    (before,) = checksums()
    (after,) = checksums("--set", "hardware.gpu_memory_mib=40960")
    assert before != after


def test_a_gpu_resource_set_through_helm_joins_the_shipped_catalogue():
    """An admin adds `amd.com/gpu` with one value; the shipped entries stay, and the servers can read it."""
    objects = helm_template(
        "--set-json", 'hardware.gpu_resources={"amd.com/gpu":{"system":"devices","units_per_gpu":1}}'
    )
    document = json.loads(one(objects, "ConfigMap", "gpu-timekeeper-hardware")["data"]["hardware.json"])
    catalogue = parse_hardware(document).catalogue
    assert catalogue.entry("amd.com/gpu") == GpuEntry(SharingSystem.DEVICES, 1)
    assert catalogue.entry("nvidia.com/gpucores") == GpuEntry(SharingSystem.HAMI)
    assert catalogue.entry("nvidia.com/gpu-0") == GpuEntry(SharingSystem.CLEARML, 8)


def test_the_node_agent_is_exempt_from_the_gpu_supply_routes_where_the_chart_puts_it():
    """Issue 36: the agent reaches every GPU through NVIDIA_VISIBLE_DEVICES; the hardware file exempts its
    namespace and ServiceAccount together, whatever the release's name and the agent's namespace."""
    objects = helm_template(
        "--set",
        "nodeAgent.enabled=true",
        "--set",
        "nodeAgent.namespace=agents",
        "--set",
        "fullnameOverride=tk",
    )
    document = json.loads(one(objects, "ConfigMap", "tk-hardware")["data"]["hardware.json"])
    account = one(objects, "DaemonSet", "tk-nodeagent")["spec"]["template"]["spec"]["serviceAccountName"]
    supply = parse_hardware(document).supply
    assert supply.exempts("agents", account)
    assert not supply.exempts("agents", "default")


def test_budgets_are_private_and_prometheus_scrapes_them_with_a_token_it_may_use():
    """/metrics names every namespace's budget (issue #25): the shipped timekeeper asks for a token, and
    the ServiceMonitor sends one of a ServiceAccount that may read every namespace, whatever the release."""
    objects = helm_template("--set", "monitoring.serviceMonitor.enabled=true", "--set", "fullnameOverride=tk")
    timekeeper = one(objects, "Deployment", "tk")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(timekeeper)["TIMEKEEPER_METRICS_AUTH"] == "token"
    (endpoint,) = one(objects, "ServiceMonitor", "tk")["spec"]["endpoints"]
    credentials = endpoint["authorization"]["credentials"]
    secret = one(objects, "Secret", credentials["name"])
    assert secret["type"] == "kubernetes.io/service-account-token" and credentials["key"] == "token"
    account = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    one(objects, "ServiceAccount", account)
    (binding,) = [
        b
        for b in find(objects, "ClusterRoleBinding")
        if {"kind": "ServiceAccount", "name": account, "namespace": "gpu-timekeeper"} in b["subjects"]
    ]
    role = one(objects, "ClusterRole", binding["roleRef"]["name"])
    assert any(
        "gpu-timekeeper.io" in rule["apiGroups"]
        and "gpubudgets" in rule["resources"]
        and "list" in rule["verbs"]
        for rule in role["rules"]
    )


def test_the_webhook_ingress_can_be_narrowed_to_the_control_plane():
    """networkPolicy.controlPlaneCIDRs: only the API server's addresses reach the webhook (issue #27)."""
    objects = helm_template("--set-json", 'networkPolicy.controlPlaneCIDRs=["10.1.0.0/24","fd00::/64"]')
    (rule,) = one(objects, "NetworkPolicy", "gpu-timekeeper-webhook")["spec"]["ingress"]
    assert rule == {
        "from": [{"ipBlock": {"cidr": "10.1.0.0/24"}}, {"ipBlock": {"cidr": "fd00::/64"}}],
        "ports": [{"port": "https", "protocol": "TCP"}],
    }
    (timekeeper_rule,) = one(objects, "NetworkPolicy", "gpu-timekeeper")["spec"]["ingress"]
    assert timekeeper_rule["from"] == [{"namespaceSelector": {}}]
