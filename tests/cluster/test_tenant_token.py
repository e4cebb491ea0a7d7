"""The sidecar's token and what a report can lower (issue 37, point 6), replayed by the `edit`-only tenant on
the real API server: `edit` grants `pods/exec` and `pods/attach`, so `kubectl exec -c
gpu-timekeeper-sidecar -- cat <token>` handed the tenant the token its pod reports with; with it, a report
naming a cheap GPU fixed the pod's model (billing weights), and one at 0 % utilisation lowered the charge
(the measured basis). Now a session in our sidecar, or a debug container in its process namespace, is
refused, and a report holding the pod's real token lowers nothing against an identical control pod.

What 1.20 cannot show: it serves no ephemeral containers (alpha, gate off), so the debug container's review
is POSTed to /validate as the API server would send it, and the shipped CEL judged with cel-python; it
drops matchConditions, so it sends every session to the webhook (the shipped CEL is checked apart).
"""

from __future__ import annotations

import copy
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from gpuaccounting import names
from tests.cluster.harness import Install, Kubectl, KubectlError, Tenant, TimekeeperApi, sidecar_token, stamp
from tests.cluster.test_tenant import charged, gpu_pod, sent_to_webhook, sidecar_of
from tests.support.pods import review
from tests.support.processes import LOCAL_HTTP, WebhookProcess
from tests.support.timekeeper import report_body

TOKEN_PATH = "/var/run/secrets/gpu-timekeeper/token"
SESSIONS_DENIAL = 'admission webhook "sessions.gpu-timekeeper.io" denied the request'
H100 = "NVIDIA-H100-80GB-HBM3"  # as GPU Feature Discovery labels the node
CHEAP = "Tesla T4"  # the model a forged report names (NVML's spelling)
WEIGHTS = {H100: 3, "Tesla-T4": 0.5}
CLOCK_SKEW = timedelta(seconds=60)  # TIMEKEEPER_CLOCK_SKEW's default: a weight starts no sooner after now
MINUTES = 3


def session_refusal(tenant: Tenant, pod: str, *args: str) -> str:
    """What kubectl prints when the API server refuses the session (fails if it opens)."""
    with pytest.raises(KubectlError) as refused:
        tenant.kubectl.run(*args[:1], pod, "-n", tenant.namespace, *args[1:])
    return refused.value.stderr


@pytest.mark.parametrize(
    "command",
    [
        ("exec", "-c", names.SIDECAR_CONTAINER_NAME, "--", "cat", TOKEN_PATH),
        ("attach", "-c", names.SIDECAR_CONTAINER_NAME),
    ],
    ids=["exec", "attach"],
)
def test_a_session_in_our_sidecar_is_refused(tenant: Tenant, command: tuple[str, ...]) -> None:
    """`kubectl exec` (and `kubectl cp`, which is exec) or `attach` into our sidecar is refused by the
    sessions webhook; the same session in the tenant's own container passes admission (and then finds no
    kubelet: this layer has none)."""
    tenant.kubectl.create(gpu_pod(tenant.namespace, "holder"))

    refusal = session_refusal(tenant, "holder", *command)
    own = session_refusal(tenant, "holder", command[0], "-c", "main", *command[3:])

    assert SESSIONS_DENIAL in refusal
    assert "rule token-volume-mount" in refusal
    assert "gpu-timekeeper" not in own


def test_a_debug_container_targeting_our_sidecar_is_refused(
    tenant: Tenant, install: Install, webhook: WebhookProcess
) -> None:
    """`kubectl debug --target=gpu-timekeeper-sidecar` (1.25+) would share the sidecar's process namespace.
    Not verified here: that the API server sends the `pods/ephemeralcontainers` UPDATE (1.20 does not
    serve it); the review the shipped rules would send is POSTed to /validate and refused."""
    stored = tenant.kubectl.create(gpu_pod(tenant.namespace, "debugged"))
    with pytest.raises(KubectlError) as unserved:
        tenant.kubectl.run(
            "debug", "debugged", "-n", tenant.namespace, "--image=busybox:1.36",
            f"--target={names.SIDECAR_CONTAINER_NAME}", "--", "cat", TOKEN_PATH,
        )  # fmt: skip
    debugged = copy.deepcopy(stored)
    debugged["spec"]["ephemeralContainers"] = [
        {
            "name": "debugger",
            "image": "busybox:1.36",
            "targetContainerName": names.SIDECAR_CONTAINER_NAME,
            "command": ["cat", TOKEN_PATH],
        }
    ]
    request = review(
        debugged, operation="UPDATE", old=stored, subresource="ephemeralcontainers", username=tenant.username
    )

    answer = webhook.client.post(f"{webhook.url}/validate", json=request).json()["response"]

    assert "ephemeralcontainers" in unserved.value.stderr or "not found" in unserved.value.stderr.lower()
    assert sent_to_webhook(install.configuration("ValidatingWebhookConfiguration"), request["request"])
    assert answer["allowed"] is False
    assert f"targetContainerName={names.SIDECAR_CONTAINER_NAME}" in answer["status"]["message"]


def test_a_debug_copy_of_the_pod_does_not_reach_our_sidecar(tenant: Tenant) -> None:
    """`kubectl debug --copy-to` makes a new pod, which the webhooks judge as any: one sharing its process
    namespace (`--share-processes`) is refused, and a copy whose sidecar would run the tenant's command is
    given ours back; the copy's token is its own pod's, mounted by our sidecar only. (This held before
    issue 37.)"""
    stored = tenant.kubectl.create(gpu_pod(tenant.namespace, "original"))
    debug = ("debug", "original", "-n", tenant.namespace, "--image=busybox:1.36")

    with pytest.raises(KubectlError) as shared:
        tenant.kubectl.run(*debug, "--copy-to=shared", "--share-processes=true", "--", "cat", TOKEN_PATH)
    tenant.kubectl.run(
        *debug, "--copy-to=replaced", "--share-processes=false",
        f"--container={names.SIDECAR_CONTAINER_NAME}", "--", "cat", TOKEN_PATH,
    )  # fmt: skip
    copied = tenant.kubectl.json("get", "pod", "replaced", "-n", tenant.namespace)

    assert 'admission webhook "validate.gpu-timekeeper.io" denied the request' in shared.value.stderr
    assert "shareProcessNamespace" in shared.value.stderr
    ours, theirs = (sidecar_of(pod) for pod in (stored, copied))
    assert (theirs["image"], theirs.get("command"), theirs.get("args")) == (
        ours["image"],
        ours.get("command"),
        ours.get("args"),
    )


def test_the_tenant_cannot_mint_a_token_for_its_pod(tenant: Tenant) -> None:
    """A TokenRequest for our audience bound to its own pod would speak as the sidecar without reaching it:
    1.20's `edit` may neither create `serviceaccounts/token` nor impersonate the pod's ServiceAccount. (This
    held before issue 37; a cluster granting either is listed in docs/security.md.)"""
    stored = tenant.kubectl.create(gpu_pod(tenant.namespace, "minted"))
    account = f"system:serviceaccount:{tenant.namespace}:default"
    request = ("create", "token", "default", "-n", tenant.namespace, f"--audience={names.TOKEN_AUDIENCE}")
    bound = ("--bound-object-kind=Pod", "--bound-object-name=minted")
    bound += (f"--bound-object-uid={stored['metadata']['uid']}",)

    for impersonating in ((), ("--as", account)):
        with pytest.raises(KubectlError) as refused:
            tenant.kubectl.run(*impersonating, *request, *bound)
        assert "forbidden" in refused.value.stderr


def labelled_node(kubectl: Kubectl, name: str) -> None:
    """A node as GPU Feature Discovery labels it (no kubelet behind it: the pods bound to it never run)."""
    labels = {"nvidia.com/gpu.product": H100}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
    kubectl.run("apply", "-f", "-", stdin=json.dumps(node))


def twins(tenant: Tenant, kubectl: Kubectl, core: client.CoreV1Api) -> dict[str, tuple[dict[str, Any], str]]:
    """A control pod and a forger, alike, on one H100 node, each with its own pod-bound token (the one the
    kubelet projects into its sidecar, which the tenant would hold)."""
    node = f"h100-{tenant.namespace}"[:63]
    labelled_node(kubectl, node)
    pods = {}
    for name in ("control", "forger"):
        stored = tenant.kubectl.create(gpu_pod(tenant.namespace, name, nodeName=node))
        pods[name] = (stored, sidecar_token(core, stored))
    return pods


def report(
    api: TimekeeperApi,
    pod: tuple[dict[str, Any], str],
    seq: int,
    start: datetime,
    seconds: int,
    gpu: dict[str, Any],
) -> None:
    """`seconds` from `start` of one GPU (`gpu`: its name and utilisation), sent with the pod's token."""
    stored, token = pod
    metadata = stored["metadata"]
    figures = {"uuid": "GPU-0", "mem_used_bytes": 1, "mem_total_bytes": 2, **gpu}
    body = report_body(
        namespace=metadata["namespace"],
        pod=metadata["name"],
        pod_uid=metadata["uid"],
        seq=seq,
        start=start,
        end=start + timedelta(seconds=seconds),
        gpus=[figures],
    )
    answer = LOCAL_HTTP.post(
        f"{api.url}/api/v1/reports", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text


def test_a_forged_gpu_model_does_not_lower_the_charge(
    tenant: Tenant, kubectl: Kubectl, core: client.CoreV1Api, api: TimekeeperApi
) -> None:
    """The issue's numbers: the forger's first report named a Tesla T4, and its H100 time cost 0.86 against
    its control's 4.49. Now the node's label decides: both are charged the H100's weight. A weight starts no
    sooner than the clock-skew allowance from now, and a report ends no later: the test waits for it."""
    weighted_from = (datetime.now(UTC) + CLOCK_SKEW + timedelta(seconds=2)).replace(microsecond=0)
    for model, weight in WEIGHTS.items():
        body = {"weight": weight, "effective_from": stamp(weighted_from)}
        api.ok("PUT", f"/billing/weights/{model}", body=body)
    pods = twins(tenant, kubectl, core)
    named = {"control": "NVIDIA H100 80GB HBM3", "forger": CHEAP}
    time.sleep(max(0.0, (weighted_from - datetime.now(UTC)).total_seconds() + 1))

    for name, pod in pods.items():
        for part in range(3):  # three reports: the first decided the model
            start = weighted_from + timedelta(seconds=20 * part)
            report(api, pod, part + 1, start, 20, {"sm_util_pct": 90.0, "name": named[name]})

    # The usage answer ends at now unless told: the minute reported ends up to a minute ahead.
    until = stamp(weighted_from + timedelta(minutes=2))
    usage = api.ok(
        "GET", f"/namespaces/{tenant.namespace}/usage?group_by=pod&since={stamp(weighted_from)}&until={until}"
    )
    figures = {row["key"]: row["gpu_minutes"] for row in usage["rows"]}
    assert figures["control"] == WEIGHTS[H100]  # one minute of one H100
    assert figures["forger"] == figures["control"]


def test_a_forged_utilisation_does_not_lower_the_charge(
    tenant: Tenant, kubectl: Kubectl, core: client.CoreV1Api, api: TimekeeperApi
) -> None:
    """Under the measured basis (floor 0.1) the forger's reports at 0 % were charged 0.23 against its
    control's 2.18 at 100 %. A report's utilisation is no longer believed in Kubernetes auth mode
    (TIMEKEEPER_TRUST_REPORTED_UTILISATION off, as shipped): both are charged their allocation."""
    api.ok("PUT", f"/namespaces/{tenant.namespace}/charge-basis", body={"basis": "measured", "floor": 0.1})
    pods = twins(tenant, kubectl, core)
    used = {"control": 100.0, "forger": 0.0}
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)

    for name, pod in pods.items():
        for minute in range(MINUTES):
            gpu = {"sm_util_pct": used[name], "name": "NVIDIA H100 80GB HBM3"}
            report(api, pod, minute + 1, start + timedelta(minutes=minute), 60, gpu)

    figures = charged(api, tenant.namespace)
    assert figures["forger"] == figures["control"]
    assert figures["control"] > 0
