"""Every kustomize build of deployment/ and every rendering of the Helm chart is schema-valid Kubernetes and
keeps the invariants we rely on."""

from __future__ import annotations

import copy
import os
import re
import tomllib
from typing import Any

import kubernetes_validate
import pytest

from gpuaccounting import names
from tests.deployment.conftest import (
    INSTALLS,
    OVERLAYS,
    RENDERS,
    ROOT,
    find,
    kustomize,
    one,
    pod_specs,
    render,
)
from tests.support.kube_rbac import timekeeper_rules
from webhook.settings import WebhookSettings

# matchConditions are GA from 1.30: the oldest Kubernetes we support, and the newest schemas we have.
KUBERNETES_VERSIONS = ["1.30.0", kubernetes_validate.utils.latest_version()]
NAMESPACE = "gpu-timekeeper"
OUR_IMAGES = (
    "ghcr.io/gpu-timekeeper/timekeeper",
    "ghcr.io/gpu-timekeeper/webhook",
    "ghcr.io/gpu-timekeeper/sidecar",
)
# Kinds of operators (no schemas offline): checked structurally here, by their own tests elsewhere.
OPERATOR_KINDS = {
    "Certificate": "cert-manager.io/v1",
    "Issuer": "cert-manager.io/v1",
    "ServiceMonitor": "monitoring.coreos.com/v1",
    "PrometheusRule": "monitoring.coreos.com/v1",
    "Cluster": "postgresql.cnpg.io/v1",
}
WEBHOOK_TLS_SECRET = "gpu-timekeeper-webhook-tls"
# Secrets an overlay may leave to the operator (docs/deployment.md says how to create them).
OPERATOR_SECRETS = {"gpu-timekeeper-database"}


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


GANG_WEBHOOKS = ("podgroups.gpu-timekeeper.io", "owners.gpu-timekeeper.io")
SESSIONS_WEBHOOK = "sessions.gpu-timekeeper.io"


def all_webhooks(objects) -> list[tuple[str, dict[str, Any]]]:
    return [
        (obj["kind"], webhook)
        for obj in objects
        if obj["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for webhook in obj["webhooks"]
    ]


def webhook_configurations(objects) -> list[tuple[str, dict[str, Any]]]:
    """The pod webhooks (the gang schedulers' are `GANG_WEBHOOKS`, the sessions one `SESSIONS_WEBHOOK`)."""
    return [
        (kind, webhook)
        for kind, webhook in all_webhooks(objects)
        if webhook["name"] not in (*GANG_WEBHOOKS, SESSIONS_WEBHOOK)
    ]


@pytest.mark.parametrize("build", RENDERS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schemas(build, version):
    for obj in render(build):
        if obj["kind"] in OPERATOR_KINDS:
            assert obj["apiVersion"] == OPERATOR_KINDS[obj["kind"]]
            continue
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_schema_check_is_strict_enough_to_catch_a_typo():
    deployment = copy.deepcopy(one(render("base"), "Deployment", "gpu-timekeeper"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def test_there_are_dev_and_production_overlays():
    assert {"dev", "production"} <= set(OVERLAYS)


@pytest.mark.parametrize("build", RENDERS)
def test_everything_namespaced_lives_in_our_namespace(build):
    objects = render(build)
    if not build.startswith("helm/"):  # Helm installs into a namespace that exists (the chart's README)
        assert one(objects, "Namespace", NAMESPACE)
    for obj in objects:
        if obj["kind"] not in {
            "Namespace",
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "PriorityClass",
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        }:
            assert obj["metadata"].get("namespace") == NAMESPACE, obj["metadata"]["name"]


@pytest.mark.parametrize("build", RENDERS)
def test_servers_are_replicated_probed_and_protected_by_a_disruption_budget(build):
    objects = render(build)
    budgets = find(objects, "PodDisruptionBudget")
    for name in ("gpu-timekeeper", "gpu-timekeeper-webhook"):
        deployment = one(objects, "Deployment", name)
        assert deployment["spec"]["replicas"] >= 2
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            assert {"livenessProbe", "readinessProbe"} <= container.keys(), name
        covering = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()]
        assert len(covering) == 1, f"{name} needs exactly one PodDisruptionBudget"
        assert covering[0]["spec"].get("maxUnavailable", 0) < deployment["spec"]["replicas"]


@pytest.mark.parametrize("build", RENDERS)
def test_services_reach_a_named_port_of_the_pods_they_select(build):
    objects = render(build)
    templates = [o["spec"]["template"] for o in find(objects, "Deployment") + find(objects, "StatefulSet")]
    for service in find(objects, "Service"):
        selected = [
            t for t in templates if service["spec"]["selector"].items() <= t["metadata"]["labels"].items()
        ]
        assert selected, f"Service {service['metadata']['name']} selects no pods"
        port_names = {p["name"] for t in selected for c in t["spec"]["containers"] for p in c["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names


@pytest.mark.parametrize("build", RENDERS)
def test_every_pod_is_non_root_with_a_read_only_root_filesystem_and_no_capabilities(build):
    for owner, spec in pod_specs(render(build)):
        pod_context = spec.get("securityContext", {})
        assert pod_context.get("runAsNonRoot") is True, owner
        assert pod_context.get("seccompProfile", {}).get("type") == "RuntimeDefault", owner
        for container in containers(spec):
            context = container.get("securityContext", {})
            assert context.get("readOnlyRootFilesystem") is True, owner
            assert context.get("allowPrivilegeEscalation") is False, owner
            assert context.get("capabilities", {}).get("drop") == ["ALL"], owner
            assert "memory" in container.get("resources", {}).get("limits", {}), owner


@pytest.mark.parametrize("build", RENDERS)
def test_images_are_pinned_and_ours_carry_the_project_version(build):
    tags = set()
    for owner, spec in pod_specs(render(build)):
        for container in containers(spec):
            image = container["image"]
            if "@sha256:" in image:
                continue
            name, _, tag = image.rpartition(":")
            assert name and "/" not in tag and tag not in ("", "latest"), f"{owner}: {image} is not pinned"
            if name in OUR_IMAGES:
                tags.add(tag)
    webhook = one(render(build), "Deployment", "gpu-timekeeper-webhook")
    env = {e["name"]: e.get("value") for e in webhook["spec"]["template"]["spec"]["containers"][0]["env"]}
    sidecar_name, _, sidecar_tag = env["WEBHOOK_SIDECAR_IMAGE"].rpartition(":")
    assert sidecar_name == "ghcr.io/gpu-timekeeper/sidecar"
    assert tags | {sidecar_tag} == {project_version()}


@pytest.mark.parametrize("build", RENDERS)
def test_rbac_is_least_privilege(build):
    objects = render(build)
    for role in find(objects, "ClusterRole") + find(objects, "Role"):
        for rule in role.get("rules", []):
            for field in ("verbs", "resources", "apiGroups"):
                assert "*" not in rule.get(field, []), f"{role['metadata']['name']}: wildcard {field}"
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), role["metadata"]["name"]
            if role["kind"] == "ClusterRole":
                assert "secrets" not in rule.get("resources", []), "no cluster-wide access to Secrets"
            if {"update", "patch", "delete"} & set(rule["verbs"]) and "secrets" in rule.get("resources", []):
                assert rule.get("resourceNames"), "writes to Secrets are limited to named ones"


@pytest.mark.parametrize("build", RENDERS)
def test_the_timekeeper_may_review_tokens_and_access_and_the_webhook_only_reads_classes_claims_pods(build):
    objects = render(build)
    subject = {"kind": "ServiceAccount", "name": "gpu-timekeeper", "namespace": NAMESPACE}
    delegators = [
        b for b in find(objects, "ClusterRoleBinding") if b["roleRef"]["name"] == "system:auth-delegator"
    ]
    assert [b["subjects"] for b in delegators] == [[subject]]
    # The API token reaches the webhook's pod only, not every pod that might use the ServiceAccount.
    webhook_account = one(objects, "ServiceAccount", "gpu-timekeeper-webhook")
    assert webhook_account["automountServiceAccountToken"] is False
    webhook_pod = one(objects, "Deployment", "gpu-timekeeper-webhook")["spec"]["template"]["spec"]
    assert webhook_pod["automountServiceAccountToken"] is True
    webhook_roles = {
        b["roleRef"]["name"]
        for b in find(objects, "ClusterRoleBinding") + find(objects, "RoleBinding")
        if any(s["name"] == "gpu-timekeeper-webhook" for s in b["subjects"])
    }
    assert webhook_roles == {"gpu-timekeeper-viewer", "gpu-timekeeper-webhook"}
    assert one(objects, "ClusterRole", "gpu-timekeeper-webhook")["rules"] == [
        {
            "apiGroups": ["scheduling.k8s.io"],
            "resources": ["priorityclasses"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaimtemplates", "resourceclaims", "deviceclasses"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["replicasets", "statefulsets"], "verbs": ["get"]},
        {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["get"]},
        {"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets"], "verbs": ["get"]},
        {
            "apiGroups": [
                "scheduling.volcano.sh",
                "scheduling.run.ai",
                "scheduling.x-k8s.io",
                "scheduling.sigs.k8s.io",
            ],
            "resources": ["podgroups"],
            "verbs": ["get"],
        },
    ]


@pytest.mark.parametrize("build", RENDERS)
def test_webhook_and_timekeeper_read_the_one_hardware_config_map(build):
    objects = render(build)
    (config_map,) = [c for c in find(objects, "ConfigMap") if "hardware.json" in c.get("data", {})]
    for deployment, variable in (("gpu-timekeeper-webhook", "WEBHOOK_HARDWARE_FILE"),
                                 ("gpu-timekeeper", "TIMEKEEPER_HARDWARE_FILE")):  # fmt: skip
        spec = one(objects, "Deployment", deployment)["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        (volume,) = [v for v in spec["volumes"] if v.get("configMap")]
        assert volume["configMap"]["name"] == config_map["metadata"]["name"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert env[variable] == f"{mount['mountPath']}/hardware.json", deployment


@pytest.mark.parametrize("build", RENDERS)
def test_network_policies_open_only_the_serving_ports(build):
    objects = render(build)
    for deployment, port_name, sources in (
        ("gpu-timekeeper-webhook", "https", None),  # the API server's address is no pod's
        ("gpu-timekeeper", "http", [{"namespaceSelector": {}}]),  # any pod in the cluster: sidecars
    ):
        pod = one(objects, "Deployment", deployment)["spec"]["template"]
        (policy,) = [
            p
            for p in find(objects, "NetworkPolicy")
            if p["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        ]
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        (rule,) = policy["spec"]["ingress"]
        assert rule.get("from") == sources
        assert rule["ports"] == [{"port": port_name, "protocol": "TCP"}]
        (container,) = pod["spec"]["containers"]
        assert port_name in {p["name"] for p in container["ports"]}


@pytest.mark.parametrize("build", RENDERS)
def test_viewer_and_admin_roles_cover_the_budget_resources(build):
    """gpubudgets (the GPUBudget CRD, and what the API authorises against) and gpubudgetdefaults: the
    viewer reads them, the admin writes them, neither their status (the timekeeper's)."""
    objects = render(build)
    expected = {
        "gpu-timekeeper-viewer": {"get", "list", "watch"},
        "gpu-timekeeper-admin": {"get", "list", "watch", "create", "update", "patch", "delete"},
    }
    for name, verbs in expected.items():
        (rule,) = one(objects, "ClusterRole", name)["rules"]
        assert (rule["apiGroups"], rule["resources"], set(rule["verbs"])) == (
            [names.DOMAIN],
            ["gpubudgets", "gpubudgetdefaults"],
            verbs,
        )
    admin_labels = one(objects, "ClusterRole", "gpu-timekeeper-admin")["metadata"].get("labels", {})
    assert not any(k.startswith("rbac.authorization.k8s.io/aggregate-to") for k in admin_labels)


@pytest.mark.parametrize("build", RENDERS)
def test_every_install_ships_the_budget_crds_served_with_status_and_kept_by_helm(build):
    objects = render(build)
    crds = {c["metadata"]["name"]: c for c in find(objects, "CustomResourceDefinition")}
    assert set(crds) == {f"gpubudgets.{names.DOMAIN}", f"gpubudgetdefaults.{names.DOMAIN}"}
    for crd in crds.values():
        (version,) = crd["spec"]["versions"]
        assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
        assert version["subresources"] == {"status": {}}
        if build.startswith("helm/"):  # deleting the CRD would delete every GPUBudget
            assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crds[f"gpubudgets.{names.DOMAIN}"]["spec"]["scope"] == "Namespaced"
    assert crds[f"gpubudgetdefaults.{names.DOMAIN}"]["spec"]["scope"] == "Cluster"
    container = one(objects, "Deployment", "gpu-timekeeper")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "TIMEKEEPER_GITOPS", "value": "true"} in container["env"]


@pytest.mark.parametrize("build", RENDERS)
def test_priority_classes_rank_in_budget_pods_above_over_budget_ones(build):
    objects = render(build)
    in_budget = one(objects, "PriorityClass", names.DEFAULT_IN_BUDGET_PRIORITY_CLASS)
    over_budget = one(objects, "PriorityClass", names.DEFAULT_OVER_BUDGET_PRIORITY_CLASS)
    assert in_budget["value"] > over_budget["value"] > 0
    assert in_budget["preemptionPolicy"] == "PreemptLowerPriority"
    assert over_budget["preemptionPolicy"] == "Never"
    assert not in_budget.get("globalDefault") and not over_budget.get("globalDefault")


def test_priority_classes_match_what_the_webhook_writes_into_pods():
    """The webhook sets priority and preemptionPolicy beside the class; the API server refuses a mismatch."""
    defaults = {name: field.default for name, field in WebhookSettings.model_fields.items()}
    objects = render("base")
    for prefix in ("in_budget", "over_budget"):
        priority_class = one(objects, "PriorityClass", defaults[f"{prefix}_priority_class"])
        assert priority_class["value"] == defaults[f"{prefix}_priority"]
        assert priority_class["preemptionPolicy"] == defaults[f"{prefix}_preemption_policy"]


@pytest.mark.parametrize("build", RENDERS)
def test_webhooks_are_bounded_and_never_see_system_or_their_own_namespace(build):
    objects = render(build)
    webhook_namespace = one(objects, "Deployment", "gpu-timekeeper-webhook")["metadata"]["namespace"]
    service = one(objects, "Service", "gpu-timekeeper-webhook")
    configurations = webhook_configurations(objects)
    assert sorted(kind for kind, _ in configurations) == [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ]
    for kind, webhook in configurations:
        assert 2 <= webhook["timeoutSeconds"] <= 3
        assert webhook["failurePolicy"] in ("Fail", "Ignore")
        assert webhook["sideEffects"] == "None"
        assert webhook["admissionReviewVersions"] == ["v1"]
        (expression,) = webhook["namespaceSelector"]["matchExpressions"]
        assert expression["key"] == "kubernetes.io/metadata.name" and expression["operator"] == "NotIn"
        assert {"kube-system", "kube-node-lease", webhook_namespace} <= set(expression["values"])
        target = webhook["clientConfig"]["service"]
        assert (target["name"], target["namespace"]) == (service["metadata"]["name"], webhook_namespace)
        assert target["port"] in [p["port"] for p in service["spec"]["ports"]]
        operations = {
            resource: rule["operations"] for rule in webhook["rules"] for resource in rule["resources"]
        }
        assert all(rule["apiGroups"] == [""] and rule["apiVersions"] == ["v1"] for rule in webhook["rules"])
        assert webhook["matchConditions"], "only GPU pods may reach the webhook"
        if kind == "MutatingWebhookConfiguration":
            assert (target["path"], operations) == ("/mutate", {"pods": ["CREATE"]})
            assert webhook["reinvocationPolicy"] == "IfNeeded"
        else:
            assert target["path"] == "/validate"
            assert operations == {"pods": ["CREATE", "UPDATE"], "pods/ephemeralcontainers": ["UPDATE"]}
    (_, mutating), (_, validating) = sorted(configurations, key=lambda c: c[0])
    assert mutating["matchConditions"] == validating["matchConditions"]


@pytest.mark.parametrize("build", RENDERS)
def test_the_gang_webhooks_mutate_podgroups_and_labelled_owners_beside_the_pod_webhook(build):
    """Where gang schedulers read a class (docs/webhook.md, "Gang schedulers"): never system namespaces."""
    webhooks = {webhook["name"]: webhook for kind, webhook in all_webhooks(render(build))}
    pods = webhooks["mutate.gpu-timekeeper.io"]
    groups, owners = (webhooks[name] for name in GANG_WEBHOOKS)
    for webhook in (groups, owners):
        assert webhook["clientConfig"] == pods["clientConfig"]
        assert webhook["namespaceSelector"] == pods["namespaceSelector"]
        assert (webhook["failurePolicy"], webhook["sideEffects"]) == (pods["failurePolicy"], "None")
        assert 2 <= webhook["timeoutSeconds"] <= 3
    assert [(r["apiGroups"], r["resources"], r["operations"]) for r in groups["rules"]] == [
        (["scheduling.volcano.sh"], ["podgroups"], ["CREATE", "UPDATE"]),
        (["batch.volcano.sh"], ["jobs"], ["CREATE", "UPDATE"]),
    ]
    assert [(r["resources"], r["operations"], r["scope"]) for r in owners["rules"]] == [
        (["*"], ["CREATE", "UPDATE"], "Namespaced")
    ]
    assert owners["objectSelector"] == {
        "matchExpressions": [{"key": "priorityClassName", "operator": "Exists"}]
    }


@pytest.mark.parametrize("build", RENDERS)
def test_the_sessions_webhook_sees_exec_and_attach_beside_the_pod_webhook(build):
    """`kubectl exec`/`cp`/`attach` into our sidecar would read its token (issue 37): the validating
    configuration sees CONNECT on both, with the pod webhook's service, namespaces and failurePolicy."""
    webhooks = {webhook["name"]: (kind, webhook) for kind, webhook in all_webhooks(render(build))}
    kind, sessions = webhooks[SESSIONS_WEBHOOK]
    _, pods = webhooks["validate.gpu-timekeeper.io"]
    assert kind == "ValidatingWebhookConfiguration"
    assert sessions["clientConfig"] == pods["clientConfig"]
    assert sessions["namespaceSelector"] == pods["namespaceSelector"]
    assert (sessions["failurePolicy"], sessions["sideEffects"]) == (pods["failurePolicy"], "None")
    assert 2 <= sessions["timeoutSeconds"] <= 3
    assert [(r["apiGroups"], r["resources"], r["operations"]) for r in sessions["rules"]] == [
        ([""], ["pods/exec", "pods/attach"], ["CONNECT"])
    ]
    assert "objectSelector" not in sessions  # the options carry no labels: a selector would match nothing


def test_production_fails_closed_and_dev_fails_open():
    for build, policy in (("overlays/production", "Fail"), ("overlays/dev", "Ignore")):
        assert {w["failurePolicy"] for _, w in all_webhooks(render(build))} == {policy}


def _webhook_tls_sources(objects) -> list[str]:
    sources = [
        f"Certificate/{c['metadata']['name']}"
        for c in find(objects, "Certificate")
        if c["spec"]["secretName"] == WEBHOOK_TLS_SECRET
    ]
    for owner, spec in pod_specs(objects):
        for container in containers(spec):
            args = container.get("args", [])
            issues = "webhook.certbootstrap" in args and "--external-issuer" not in args
            if issues and f"--tls-secret={WEBHOOK_TLS_SECRET}" in args:
                sources.append(owner)
    return sources


@pytest.mark.parametrize("build", INSTALLS)
def test_each_overlay_has_one_source_for_the_webhook_certificate(build):
    objects = render(build)
    sources = _webhook_tls_sources(objects)
    certificates = find(objects, "Certificate")
    if certificates:
        (certificate,) = certificates
        assert sources == [f"Certificate/{certificate['metadata']['name']}"]
        if certificate["spec"]["issuerRef"]["kind"] == "Issuer":  # else the cluster's own ClusterIssuer
            issuer = one(objects, "Issuer", certificate["spec"]["issuerRef"]["name"])
            assert issuer["metadata"]["namespace"] == NAMESPACE
        assert f"gpu-timekeeper-webhook.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
        injected = f"{NAMESPACE}/{certificate['metadata']['name']}"
        for obj in find(objects, "MutatingWebhookConfiguration") + find(
            objects, "ValidatingWebhookConfiguration"
        ):
            assert obj["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == injected
    else:
        assert sorted(sources) == ["CronJob/gpu-timekeeper-certbootstrap", "Job/gpu-timekeeper-certbootstrap"]
        cronjob = one(objects, "CronJob", "gpu-timekeeper-certbootstrap")
        assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"


@pytest.mark.parametrize("build", INSTALLS)
def test_each_overlay_restarts_the_webhook_when_its_certificate_changes(build):
    """The webhook loads its certificate at start: something must roll it after every renewal."""
    objects = render(build)
    restarters = [
        owner
        for owner, spec in pod_specs(objects)
        for container in containers(spec)
        if owner.startswith("CronJob/")
        and container.get("args", [])[:3] == ["python", "-m", "webhook.certbootstrap"]
        and "--restart-deployment=gpu-timekeeper-webhook" in container["args"]
        and f"--tls-secret={WEBHOOK_TLS_SECRET}" in container["args"]
    ]
    assert len(restarters) == 1
    cronjob = one(objects, "CronJob", restarters[0].removeprefix("CronJob/"))
    account = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"]
    (binding,) = [b for b in find(objects, "RoleBinding") if any(s["name"] == account for s in b["subjects"])]
    rules = one(objects, "Role", binding["roleRef"]["name"])["rules"]
    assert {
        "apiGroups": ["apps"],
        "resources": ["deployments"],
        "resourceNames": ["gpu-timekeeper-webhook"],
        "verbs": ["get", "patch"],
    } in rules


def test_the_certificate_bootstrap_may_touch_only_its_own_objects():
    objects = render("overlays/dev")
    role = one(objects, "Role", "gpu-timekeeper-certbootstrap")
    named = {r for rule in role["rules"] for r in rule.get("resourceNames", [])}
    assert named == {WEBHOOK_TLS_SECRET, "gpu-timekeeper-webhook-ca", "gpu-timekeeper-webhook"}
    unnamed = [rule for rule in role["rules"] if not rule.get("resourceNames")]
    assert unnamed == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]
    (cluster_rule,) = one(objects, "ClusterRole", "gpu-timekeeper-certbootstrap")["rules"]
    assert cluster_rule["resourceNames"] == ["gpu-timekeeper"]
    assert set(cluster_rule["verbs"]) == {"get", "patch"}


@pytest.mark.parametrize("build", INSTALLS)
def test_every_secret_a_pod_uses_exists_or_is_one_the_operator_creates(build):
    objects = render(build)
    provided = {s["metadata"]["name"] for s in find(objects, "Secret")}
    provided |= {c["spec"]["secretName"] for c in find(objects, "Certificate")}
    provided |= {f"{c['metadata']['name']}-app" for c in find(objects, "Cluster")}  # CloudNativePG's
    provided |= {WEBHOOK_TLS_SECRET} if _webhook_tls_sources(objects) else set()
    for owner, spec in pod_specs(objects):
        used = {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
        for container in containers(spec):
            used |= {
                e["valueFrom"]["secretKeyRef"]["name"]
                for e in container.get("env", [])
                if "secretKeyRef" in e.get("valueFrom", {})
            }
        assert used <= provided | OPERATOR_SECRETS, f"{owner} uses {used - provided}"


def test_the_try_out_database_is_only_in_dev():
    assert find(render("overlays/dev"), "StatefulSet", "gpu-timekeeper-postgres")
    assert one(render("overlays/dev"), "Secret", "gpu-timekeeper-database")["type"] == "Opaque"
    assert not find(render("overlays/production"), "StatefulSet")
    assert not find(render("overlays/production"), "Secret")


@pytest.mark.parametrize("build", RENDERS)
def test_the_migration_job_runs_alembic_against_the_configured_database(build):
    objects = render(build)
    job = one(objects, "Job", "gpu-timekeeper-migrate")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["alembic", "upgrade", "head"]
    assert re.fullmatch(r"ghcr\.io/gpu-timekeeper/timekeeper:.+", container["image"])
    env = {e["name"]: e for e in container["env"]}
    timekeeper = one(objects, "Deployment", "gpu-timekeeper")["spec"]["template"]["spec"]["containers"][0]
    served = {e["name"]: e for e in timekeeper["env"]}
    assert env["TIMEKEEPER_DATABASE_URL"] == served["TIMEKEEPER_DATABASE_URL"]
    if build == "helm/cloudnativepg":  # the Secret CloudNativePG writes for the Cluster
        expected = {"name": f"{one(objects, 'Cluster', 'gpu-timekeeper-postgres')['metadata']['name']}-app"}
        expected["key"] = "uri"
    else:
        expected = {"name": "gpu-timekeeper-database", "key": "url"}
    assert env["TIMEKEEPER_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == expected
    assert job["spec"]["ttlSecondsAfterFinished"] > 0


@pytest.mark.parametrize("build", RENDERS)
def test_the_timekeeper_authenticates_through_kubernetes_in_clusters(build):
    container = one(render(build), "Deployment", "gpu-timekeeper")["spec"]["template"]["spec"]["containers"][
        0
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TIMEKEEPER_AUTH_MODE"] == "kubernetes"


@pytest.mark.parametrize("build", RENDERS)
def test_the_reconciler_runs_with_exactly_the_rbac_it_needs(build):
    """On in every overlay, in the API process whose replicas elect the scheduler's one leader; its
    ClusterRole is the reconcile rules tests/kube runs the client with (the reviews come through
    system:auth-delegator), nothing more."""
    objects = render(build)
    container = one(objects, "Deployment", "gpu-timekeeper")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TIMEKEEPER_RECONCILE"] == "true"
    assert env.get("TIMEKEEPER_SCHEDULER_ENABLED", "true") == "true"
    binding = one(objects, "ClusterRoleBinding", "gpu-timekeeper")
    assert binding["roleRef"]["name"] == "gpu-timekeeper"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-timekeeper", "namespace": NAMESPACE}
    ]

    def grants(rules):
        return {
            (group, resource, verb)
            for rule in rules
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }

    reviews = {"authentication.k8s.io", "authorization.k8s.io"}
    needed = {grant for grant in grants(timekeeper_rules()) if grant[0] not in reviews}
    assert grants(one(objects, "ClusterRole", "gpu-timekeeper")["rules"]) == needed
    assert ("", "pods/eviction", "create") in needed and ("", "events", "create") in needed


@pytest.mark.parametrize("build", RENDERS)
def test_the_webhook_authenticates_to_the_timekeeper_with_an_audience_bound_token(build):
    spec = one(render(build), "Deployment", "gpu-timekeeper-webhook")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    (source,) = volumes["timekeeper-token"]["projected"]["sources"]
    token = source["serviceAccountToken"]
    assert token["audience"] == names.TOKEN_AUDIENCE
    assert env["WEBHOOK_TIMEKEEPER_TOKEN_FILE"] == f"{mounts['timekeeper-token']}/{token['path']}"
    assert env["WEBHOOK_TLS_CERT_FILE"] == f"{mounts['tls']}/tls.crt"
    assert env["WEBHOOK_TLS_KEY_FILE"] == f"{mounts['tls']}/tls.key"
    assert volumes["tls"]["secret"]["secretName"] == WEBHOOK_TLS_SECRET


@pytest.mark.parametrize("build", RENDERS)
def test_the_timekeeper_url_resolves_from_every_namespace_the_sidecar_is_injected_into(build):
    objects = render(build)
    timekeeper = one(objects, "Service", "gpu-timekeeper")
    container = one(objects, "Deployment", "gpu-timekeeper-webhook")["spec"]["template"]["spec"][
        "containers"
    ][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    service_port = timekeeper["spec"]["ports"][0]["port"]
    expected = (
        f"http://{timekeeper['metadata']['name']}.{timekeeper['metadata']['namespace']}.svc:{service_port}"
    )
    assert env["WEBHOOK_TIMEKEEPER_URL"] == expected


def test_the_webhook_ingress_can_be_narrowed_to_the_control_plane(tmp_path):
    """The control-plane-ingress component, with its CIDR patched as docs/deployment.md says (issue #27)."""
    deployment = os.path.relpath(ROOT / "deployment", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"""apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [{deployment}/overlays/production]
components: [{deployment}/components/control-plane-ingress]
patches:
  - target: {{kind: NetworkPolicy, name: gpu-timekeeper-webhook}}
    patch: |-
      - op: replace
        path: /spec/ingress/0/from/0/ipBlock/cidr
        value: 172.18.0.0/16
"""
    )
    objects = kustomize(tmp_path)
    (rule,) = one(objects, "NetworkPolicy", "gpu-timekeeper-webhook")["spec"]["ingress"]
    assert rule == {
        "from": [{"ipBlock": {"cidr": "172.18.0.0/16"}}],
        "ports": [{"port": "https", "protocol": "TCP"}],
    }
