"""A hostile tenant against the shipped install (issue 25): a member of its namespace with only the built-in
`edit` role replays each way it found around its budget, writing with its own token on the real API server.

What a tenant writes is input, never truth: a sidecar it brings becomes ours, our sidecar's env and token
stay ours, a critical class does not lift an exhausted namespace's pod, a share too small to charge is
refused, a report's share is not the one charged, and an UPDATE that removes the GPU markers is still
judged. docs/security.md maps each of these to the threat it closes. The layer runs on the kustomize base,
and again with TIMEKEEPER_TEST_CLUSTER_INSTALL=helm on the Helm chart (`harness.render_chart`).
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import celpy
import httpx
import pytest
from kubernetes import client

from gpuaccounting import names
from gpuaccounting.hardware import load_hardware
from gpuaccounting.shares import SharingSystem, format_share
from tests.cluster.harness import (
    Install,
    Kubectl,
    KubectlError,
    Tenant,
    TimekeeperApi,
    placed,
    set_status,
    sidecar_token,
    stamp,
    terminated,
    wait_for_admission_state,
)
from tests.support.pods import GPU_PODS, container, pod, review
from tests.support.processes import LOCAL_HTTP, WebhookProcess, wait_until
from tests.support.timekeeper import report_body

OVER_BUDGET = ("gpu-over-budget", 100)
LOOT = "loot"  # the tenant's shared emptyDir, through which its own container would read our token
REPORTED_MINUTES = 3
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
SHARE_MISMATCHES = "timekeeper_report_share_mismatches_total"
TINY_SHARE = "0.000001"  # what the tenant's own sidecar claims for a one-GPU pod


def gpu_pod(namespace: str, name: str, *extra: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """One GPU for the tenant's `main` container, beside `extra` containers."""
    return pod(container("main", {"nvidia.com/gpu": 1}), *extra, name=name, namespace=namespace, **spec)


def sidecar_of(stored: dict[str, Any]) -> dict[str, Any]:
    (sidecar,) = [c for c in stored["spec"]["containers"] if c["name"] == names.SIDECAR_CONTAINER_NAME]
    return sidecar


def ours(tenant: Tenant) -> dict[str, Any]:
    """The sidecar the webhook injects into the tenant's plain one-GPU pod (asked with a dry run)."""
    return sidecar_of(tenant.kubectl.create(gpu_pod(tenant.namespace, "plain"), "--dry-run=server"))


def with_loot(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with an emptyDir that its `main` container mounts: where a leaked token would be read."""
    body["spec"]["volumes"] = [{"name": LOOT, "emptyDir": {}}]
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": LOOT, "mountPath": "/loot"}]
    return body


def env_names(sidecar: dict[str, Any]) -> list[str]:
    return [variable["name"] for variable in sidecar.get("env", [])]


def env_value(sidecar: dict[str, Any], name: str) -> str:
    (value,) = [variable.get("value") for variable in sidecar["env"] if variable["name"] == name]
    return str(value)


def mounted_volumes(container: dict[str, Any]) -> set[str]:
    """The volumes `container` mounts, but for the API server's own token that the ServiceAccount
    admission plugin mounts into every container."""
    return {
        mount["name"]
        for mount in container.get("volumeMounts", [])
        if mount["mountPath"] != SERVICE_ACCOUNT_MOUNT
    }


def test_a_tenant_cannot_take_its_namespace_out_of_the_webhooks_reach(tenant: Tenant) -> None:
    """The webhooks' namespaceSelector reads the namespace's labels: `edit` may not change them. (This
    held before issue 25; the attacks below did not.)"""
    with pytest.raises(KubectlError) as refused:
        tenant.kubectl.run("label", "namespace", tenant.namespace, "kubernetes.io/metadata.name=kube-system")

    assert "forbidden" in refused.value.stderr.lower()


def own_sidecar_pod(namespace: str, name: str, image: str) -> dict[str, Any]:
    """Issue 25's pod: a container with our name and the official image, its own command,
    SIDECAR_GPU_SHARE "1" then "0.000001" (the kubelet keeps the last), and a mount of a shared emptyDir
    beside the token."""
    own = {
        "name": names.SIDECAR_CONTAINER_NAME,
        "image": image,
        "command": ["sh", "-c", "cp /var/run/secrets/gpu-timekeeper/token /loot/ && exec python -m sidecar"],
        "env": [
            {"name": "SIDECAR_GPU_SHARE", "value": "1"},
            {"name": "SIDECAR_GPU_SHARE", "value": TINY_SHARE},
        ],
        "volumeMounts": [
            {"name": names.SIDECAR_TOKEN_VOLUME, "mountPath": "/var/run/secrets/gpu-timekeeper"},
            {"name": LOOT, "mountPath": "/loot"},
        ],
    }
    return with_loot(gpu_pod(namespace, name, own))


def test_a_tenants_own_sidecar_is_replaced_by_ours(tenant: Tenant) -> None:
    """The webhook's choice (docs/webhook.md): a container with our name is replaced, not refused."""
    control = tenant.kubectl.create(gpu_pod(tenant.namespace, "control"))
    official = sidecar_of(control)

    stored = tenant.kubectl.create(own_sidecar_pod(tenant.namespace, "own", official["image"]))

    assert sidecar_of(stored) == official
    assert [c["name"] for c in stored["spec"]["containers"]] == ["main", names.SIDECAR_CONTAINER_NAME]


@pytest.mark.parametrize(
    ("variable", "claimed"),
    [("SIDECAR_GPU_SHARE", TINY_SHARE), ("SIDECAR_TIMEKEEPER_URL", "http://tenant.invalid:8080")],
)
def test_our_sidecar_never_carries_a_duplicate_env(tenant: Tenant, variable: str, claimed: str) -> None:
    """Our sidecar as injected, the variable listed a second time: the kubelet would run with the last."""
    sidecar = ours(tenant)
    expected = env_value(sidecar, variable)
    sidecar["env"].append({"name": variable, "value": claimed})

    stored = tenant.kubectl.create(gpu_pod(tenant.namespace, "twice", sidecar))

    stored_env = env_names(sidecar_of(stored))
    assert len(stored_env) == len(set(stored_env))
    assert env_value(sidecar_of(stored), variable) == expected


def test_no_container_but_our_sidecar_reaches_its_token(tenant: Tenant) -> None:
    """Our sidecar as injected, plus a mount of an emptyDir the tenant's container mounts too."""
    sidecar = ours(tenant)
    sidecar["volumeMounts"].append({"name": LOOT, "mountPath": "/loot"})

    stored = tenant.kubectl.create(with_loot(gpu_pod(tenant.namespace, "leaky", sidecar)))

    theirs = {
        volume
        for c in stored["spec"]["containers"]
        if c["name"] != names.SIDECAR_CONTAINER_NAME
        for volume in mounted_volumes(c)
    }
    mounted = mounted_volumes(sidecar_of(stored))
    assert mounted == {names.SIDECAR_TOKEN_VOLUME, names.SIDECAR_BUFFER_VOLUME, names.SIDECAR_PODINFO_VOLUME}
    assert not mounted & theirs


def test_a_gpu_pod_may_not_share_its_process_namespace(tenant: Tenant) -> None:
    """One process namespace would let the tenant's container read our token through /proc/<pid>/root."""
    shared = gpu_pod(tenant.namespace, "shared", shareProcessNamespace=True)

    refusal = tenant.kubectl.refusal(shared)

    assert 'admission webhook "validate.gpu-timekeeper.io" denied the request' in refusal
    assert "shareProcessNamespace" in refusal


@pytest.mark.parametrize("critical", ["system-cluster-critical", "system-node-critical"])
def test_a_critical_class_does_not_lift_an_exhausted_tenants_gpu_pod(
    tenant: Tenant, kubectl: Kubectl, api: TimekeeperApi, critical: str
) -> None:
    """The classes are exempt where an admin lists them (kube-system and ours), not in a tenant's."""
    api.set_budget(tenant.namespace, 0)
    wait_for_admission_state(kubectl, tenant.namespace, "exhausted")

    stored = tenant.kubectl.create(gpu_pod(tenant.namespace, "critical", priorityClassName=critical))

    assert (stored["spec"]["priorityClassName"], stored["spec"]["priority"]) == OVER_BUDGET


@pytest.mark.parametrize(
    "annotations",
    [{"gpu-fraction": "0.0000001"}, {"gpu-fraction": "0.000001"}, {"gpu-memory": "1"}],
    ids=["fraction-1e-7", "fraction-1e-6", "memory-1MiB"],
)
def test_a_share_below_the_floor_is_refused_naming_the_floor(
    tenant: Tenant, annotations: dict[str, str]
) -> None:
    """KAI's gpu-fraction 1e-7 was admitted as share 0 and never charged; 1e-6 and one MiB ran a GPU for
    next to nothing. The floor is the webhook's default hardware file's (the layer sets none)."""
    tiny = pod(container("main"), name="tiny", namespace=tenant.namespace, annotations=annotations)

    refusal = tenant.kubectl.refusal(tiny)

    floor = load_hardware(None).minimum_share(SharingSystem.KAI)
    assert 'admission webhook "validate.gpu-timekeeper.io" denied the request' in refusal
    assert f"smallest share gpu-timekeeper admits for kai, {format_share(floor)}" in refusal


def test_the_smallest_share_admitted_is_charged_for_a_silent_pod(
    tenant: Tenant, kubectl: Kubectl, api: TimekeeperApi
) -> None:
    """Every share admission admits can be charged: a KAI pod at the floor that never reported, run six
    minutes, is charged six minutes at the floor by the reconcile pass (a guard; the floor made it so)."""
    floor = format_share(load_hardware(None).minimum_share(SharingSystem.KAI))
    small = pod(
        container("main"), name="small", namespace=tenant.namespace, annotations={"gpu-fraction": floor}
    )
    stored = tenant.kubectl.create(small)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    status = {
        "phase": "Succeeded",
        "startTime": stamp(start),
        "containerStatuses": terminated(stored, start + timedelta(minutes=6)),
    }
    set_status(kubectl, tenant.namespace, "small", status)  # as the kubelet would

    wait_until(lambda: "small" in charged(api, tenant.namespace), timeout=30, what="the pass to charge it")

    assert charged(api, tenant.namespace) == {"small": 6 * Decimal(floor)}


def report(api: TimekeeperApi, token: str, stored: dict[str, Any], minute: int, share: str) -> httpx.Response:
    """Minute `minute` of the last ten, as the pod's sidecar reports it, claiming `share`."""
    metadata = stored["metadata"]
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10 - minute)
    body = report_body(
        namespace=metadata["namespace"],
        pod=metadata["name"],
        pod_uid=metadata["uid"],
        seq=minute + 1,
        start=start,
        minutes=1,
        gpu_share=float(share),
    )
    return LOCAL_HTTP.post(
        f"{api.url}/api/v1/reports", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )


def share_mismatches(api: TimekeeperApi) -> float:
    """The timekeeper's count of reports that stated another share than their pod's admitted one."""
    metrics = LOCAL_HTTP.get(
        f"{api.url}/metrics", headers={"Authorization": f"Bearer {api.admin_token}"}, timeout=10
    )
    assert metrics.status_code == 200, metrics.text
    found = [line for line in metrics.text.splitlines() if line.startswith(f"{SHARE_MISMATCHES} ")]
    assert found, f"the timekeeper exports no {SHARE_MISMATCHES}"
    return float(found[0].split()[1])


def charged(api: TimekeeperApi, namespace: str) -> dict[str, Decimal]:
    usage = api.ok("GET", f"/namespaces/{namespace}/usage?group_by=pod&since=2000-01-01T00:00:00Z")
    return {row["key"]: Decimal(str(row["gpu_minutes"])) for row in usage["rows"]}


def test_a_report_is_charged_the_share_admitted_not_the_share_it_claims(
    tenant: Tenant, core: client.CoreV1Api, api: TimekeeperApi
) -> None:
    """Issue 25's numbers: the own-sidecar pod reported 0.000001 and was charged a millionth of its twin.
    Each pod's token is the one the kubelet projects into it (TokenRequest, bound to the pod)."""
    control = tenant.kubectl.create(gpu_pod(tenant.namespace, "control"))
    own = tenant.kubectl.create(own_sidecar_pod(tenant.namespace, "own", sidecar_of(control)["image"]))
    mismatches_before = share_mismatches(api)
    for stored, share in ((control, "1"), (own, TINY_SHARE)):
        token = sidecar_token(core, stored)
        for minute in range(REPORTED_MINUTES):
            answer = report(api, token, stored, minute, share)
            assert answer.status_code == 200, answer.text

    figures = charged(api, tenant.namespace)

    assert figures["control"] == REPORTED_MINUTES
    assert abs(figures["own"] - figures["control"]) <= figures["control"] / 100
    assert share_mismatches(api) - mismatches_before == REPORTED_MINUTES  # the own pod's, not the control's


def sent_to_webhook(configuration: dict[str, Any], request: dict[str, Any]) -> bool:
    """Whether a 1.30+ API server would send `request` to the configuration's webhook: every matchCondition
    true (the shipped CEL, evaluated with cel-python: this 1.20 API server drops matchConditions)."""
    (webhook,) = [w for w in configuration["webhooks"] if w["name"].split(".")[0] in ("mutate", "validate")]
    variables = {
        "object": celpy.json_to_cel(request["object"]),
        "oldObject": celpy.json_to_cel(request["oldObject"]),
        "request": celpy.json_to_cel(request),
    }
    environment = celpy.Environment()
    return all(
        bool(environment.program(environment.compile(condition["expression"])).evaluate(variables))
        for condition in webhook.get("matchConditions", [])
    )


def without_markers(stored: dict[str, Any], system: str) -> dict[str, Any]:
    """The pod with its sharing system's marker and our share annotation removed."""
    updated = copy.deepcopy(stored)
    metadata = updated["metadata"]
    del metadata["annotations"][names.ANNOTATION_GPU_SHARE]
    if system == "kai":
        del metadata["annotations"]["gpu-fraction"]
    else:
        del metadata["labels"]["clearml-injector/fraction"]
    return updated


@pytest.mark.parametrize("system", ["kai", "clearml"])
def test_an_update_dropping_the_gpu_markers_is_sent_to_validate_and_denied(
    tenant: Tenant, install: Install, webhook: WebhookProcess, system: str
) -> None:
    """After such an update a relist sees no GPU pod. 1.20 sends every UPDATE to /validate, so the real
    refusal proves only the webhook; whether 1.30+ sends it is the shipped matchConditions' call."""
    original, _ = GPU_PODS[system]
    stored = tenant.kubectl.create(placed(original, tenant.namespace, "marked"))
    updated = without_markers(stored, system)
    request = review(updated, operation="UPDATE", old=stored, username=tenant.username)

    answer = webhook.client.post(f"{webhook.url}/validate", json=request).json()["response"]
    with pytest.raises(KubectlError) as refused:
        tenant.kubectl.run("replace", "-f", "-", stdin=json.dumps(updated))

    assert sent_to_webhook(install.configuration("ValidatingWebhookConfiguration"), request["request"])
    assert answer["allowed"] is False
    assert names.ANNOTATION_GPU_SHARE in answer["status"]["message"]
    assert 'admission webhook "validate.gpu-timekeeper.io" denied the request' in refused.value.stderr
