"""One budget across clusters (issue #42, docs/fleet.md), on two real API servers: the cluster layer's own
control plane is cluster `a`, the hub's own (local) cluster, and this module starts a second one, with its
own state, ports and service-account signing key, as member `b`. One timekeeper, the hub, serves both
(Kubernetes auth mode, a real PostgreSQL): `a` through its admin kubeconfig, its principals naming no
cluster and alone administering across the fleet; `b` through the kubeconfig docs/fleet.md builds from the
token deployment/member's Secret holds, so `b` runs exactly the member install we ship (its webhook as a
process here, polling the hub with WEBHOOK_CLUSTER=b, registered with b's API server).

What it shows: a pool spanning a's `team-x` and `b/team-x` is exhausted by reports from cluster a alone,
whatever b's admin grants its team-x, and b's webhook then gives b's team-x GPU pods the reduced class; a
sidecar token of cluster a reports for no pod of cluster b, whichever cluster it names; a namespace reader
of cluster a reads its own budget and not cluster b's; a hub configured with one API server under two names
refuses those members, naming both, and a member whose API server does not answer is a 503; with the hub
stopped, b's webhook keeps its last decision and the reports a real sidecar in b buffered arrive after and
are charged once.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import yaml
from kubernetes import client, config

from demo.pods import sidecar_env
from gpuaccounting.names import (
    ANNOTATION_BUDGET_STATE,
    CLUSTER_HEADER,
    DEFAULT_OVER_BUDGET_PRIORITY_CLASS,
    SIDECAR_CONTAINER_NAME,
)
from tests.cluster.conftest import SKIPPED, start_webhook
from tests.cluster.harness import (
    INSTALL_NAMESPACE,
    Kubectl,
    WebhookTls,
    gpu_probe,
    hub_kubeconfig,
    kubeconfig_for_token,
    placed,
    render_member,
    run_certbootstrap,
    service_account_kubeconfig,
    service_account_token,
    sidecar_token,
    wait_for_admission_state,
)
from tests.sidecar.coverage import persisted_state
from tests.support.control_plane import ControlPlane, Unavailable, required
from tests.support.processes import (
    LOCAL_HTTP,
    SidecarProcess,
    TimekeeperProcess,
    WebhookProcess,
    free_port,
    wait_until,
)
from tests.support.timekeeper import migrated_database, report_body

NANO = Decimal("0.000000001")
POOL = "fleet-x"


@dataclass(frozen=True)
class Member:
    """One member cluster as the tests drive it: its control plane, the `kubernetes` client and kubectl
    as its admin, and its name at the hub."""

    name: str
    cluster: str | None  # what the hub calls it: None for its own cluster
    plane: ControlPlane
    core: client.CoreV1Api
    kubectl: Kubectl
    namespaces: list[str] = field(default_factory=list)  # created by the tests

    @property
    def admin_token(self) -> str:
        return self.plane.admin_token


@dataclass(frozen=True)
class Hub:
    """The hub's API over HTTP: each call names a member cluster (CLUSTER_HEADER) or none (the hub's own)."""

    process: TimekeeperProcess

    def request(
        self,
        method: str,
        path: str,
        token: str,
        cluster: str | None = None,
        body: dict[str, Any] | None = None,
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        if cluster is not None:
            headers[CLUSTER_HEADER] = cluster
        url = f"{self.process.url}/api/v1{path}"
        return LOCAL_HTTP.request(method, url, json=body, headers=headers, timeout=10)

    def ok(self, method: str, path: str, token: str, cluster: str | None = None, **kwargs: Any) -> Any:
        response = self.request(method, path, token, cluster, **kwargs)
        assert response.is_success, f"{method} {path} ({cluster}): {response.status_code} {response.text}"
        return response.json()

    def report(
        self, token: str, cluster: str | None, pod: dict[str, Any], seq: int, **overrides: Any
    ) -> httpx.Response:
        """One minute of `pod`'s GPU use, as its sidecar reports it (the minute `seq` minutes ago)."""
        metadata = pod["metadata"]
        identity = {"namespace": metadata["namespace"], "pod": metadata["name"], "pod_uid": metadata["uid"]}
        start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10 - seq)
        body = report_body(**(identity | overrides), seq=seq, start=start, minutes=1)
        return self.request("POST", "/reports", token, cluster, body=body)

    def charged(self, member: Member, namespace: str) -> Decimal:
        """All of a member namespace's charged use, whatever period it fell in, as that member's admin."""
        usage = self.ok(
            "GET",
            f"/namespaces/{namespace}/usage?since=2000-01-01T00:00:00Z",
            member.admin_token,
            member.cluster,
        )
        return Decimal(str(usage["total_gpu_minutes"]))


def member_of(name: str, cluster: str | None, plane: ControlPlane) -> Iterator[Member]:
    api_client = config.new_client_from_config(config_file=str(plane.kubeconfig))
    try:
        yield Member(name, cluster, plane, client.CoreV1Api(api_client), Kubectl(plane.kubeconfig))
    finally:
        api_client.close()


@pytest.fixture(scope="module")
def cluster_a(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Member]:
    """The cluster layer's control plane, the hub's own cluster (named by no header). Where an earlier test
    of the layer applied the shipped install to it, GPU pods are admitted only while its webhook answers:
    that webhook is then started too (the hub never hears from it: these tests report for a's pods
    themselves)."""
    for member in member_of("a", None, control_plane):
        try:
            member.kubectl.run("get", "mutatingwebhookconfiguration", "gpu-timekeeper")
        except AssertionError:
            pass
        else:
            request.getfixturevalue("webhook")
        yield member
        if member.namespaces:  # the layer's control plane outlives this module
            member.kubectl.run("delete", "namespace", *member.namespaces, "--wait=false")


@pytest.fixture(scope="module")
def cluster_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Member]:
    """A second control plane, with its own KUBE_CP_DIR (state, PKI, signing key) and free ports."""
    try:
        plane = ControlPlane.up(tmp_path_factory.mktemp("kube-cp-b"))
    except Unavailable as error:
        if required():
            pytest.fail(f"cluster layer: {error}", pytrace=False)
        pytest.skip(f"{SKIPPED}{error}")
    try:
        yield from member_of("b", "b", plane)
    finally:
        plane.down()


@dataclass(frozen=True)
class MemberInstall:
    webhook_port: int
    tls: WebhookTls
    hub_kubeconfig: Path


@pytest.fixture(scope="module")
def member_install(cluster_b: Member, tmp_path_factory: pytest.TempPathFactory) -> MemberInstall:
    """deployment/member applied to b, its webhook certificate from the self-signed bootstrap (run as
    its own ServiceAccount there), and the hub's kubeconfig for b from the member's token Secret."""
    folder = tmp_path_factory.mktemp("member-b")
    port = free_port()
    cluster_b.kubectl.run(
        "apply", "--validate=false", "-f", "-", stdin=render_member(f"https://127.0.0.1:{port}", folder)
    )
    bootstrap = service_account_kubeconfig(
        cluster_b.plane, cluster_b.core, "gpu-timekeeper-certbootstrap", folder
    )
    run_certbootstrap(bootstrap)
    secret = cluster_b.core.read_namespaced_secret("gpu-timekeeper-webhook-tls", INSTALL_NAMESPACE)
    data = {key: base64.b64decode(value) for key, value in secret.data.items()}
    (folder / "tls.crt").write_bytes(data["tls.crt"])
    (folder / "tls.key").write_bytes(data["tls.key"])
    (folder / "tls.key").chmod(0o600)
    tls = WebhookTls(folder / "tls.crt", folder / "tls.key", data["ca.crt"])
    return MemberInstall(
        port, tls, hub_kubeconfig(cluster_b.plane, cluster_b.core, folder / "hub-b.kubeconfig")
    )


def hub_env(local: Member, members: dict[str, Path]) -> dict[str, str]:
    """A hub's settings: `local`'s admin kubeconfig for its own cluster, a kubeconfig per member."""
    return {
        "TIMEKEEPER_AUTH_MODE": "kubernetes",
        "TIMEKEEPER_KUBE_IN_CLUSTER": "false",
        "TIMEKEEPER_KUBECONFIG": str(local.plane.kubeconfig),
        "TIMEKEEPER_MEMBERS": json.dumps({name: {"kubeconfig": str(path)} for name, path in members.items()}),
        "TIMEKEEPER_LOG_FORMAT": "json",
    }


@pytest.fixture(scope="module")
def hub(
    cluster_a: Member, member_install: MemberInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Hub]:
    """`python -m timekeeper` serving member b beside its own cluster (a's API server)."""
    folder = tmp_path_factory.mktemp("hub")
    env = hub_env(cluster_a, {"b": member_install.hub_kubeconfig})
    with migrated_database("gtk_fleet") as database:
        process = TimekeeperProcess(database, env, free_port(), folder / "timekeeper.log")
        process.start()
        yield Hub(process)
        process.stop()


@pytest.fixture(scope="module")
def webhook_b(
    cluster_b: Member, member_install: MemberInstall, hub: Hub, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookProcess]:
    """b's webhook, where b's configurations point, polling the hub as b's member (WEBHOOK_CLUSTER)."""
    folder = tmp_path_factory.mktemp("webhook-b")
    process = start_webhook(
        cluster_b.plane,
        cluster_b.core,
        member_install.tls,
        hub.process,
        folder,
        member_install.webhook_port,
        WEBHOOK_CLUSTER="b",
        WEBHOOK_SIDECAR_REPORT_INTERVAL_SECONDS="1",
    )
    yield process
    process.stop()


def namespace_in(member: Member, name: str) -> str:
    """`name` in the member, ready for pods (its default ServiceAccount has its token)."""
    member.kubectl.run("create", "namespace", name)
    member.namespaces.append(name)

    def ready() -> bool:
        accounts = member.core.list_namespaced_service_account(name).items
        return any(a.metadata.name == "default" and a.secrets for a in accounts)

    wait_until(ready, timeout=30, what=f"the default ServiceAccount of {name} in {member.name}")
    return name


def gpu_pod(member: Member, namespace: str, name: str) -> dict[str, Any]:
    """A one-GPU pod, created through whatever admits pods in the member."""
    return member.kubectl.create(placed(gpu_probe(namespace), namespace, name))


def test_a_pool_across_clusters_spent_in_a_reduces_bs_pods(
    cluster_a: Member, cluster_b: Member, hub: Hub, webhook_b: WebhookProcess
) -> None:
    team_a, team_b = namespace_in(cluster_a, "team-x"), namespace_in(cluster_b, "team-x")
    pool = {"budget_gpu_minutes": 3, "members": [{"namespace": "team-x"}, {"namespace": "b/team-x"}]}
    created = hub.request("PUT", f"/pools/{POOL}", cluster_a.admin_token, body=pool)  # the hub's own admin
    assert created.status_code == 200, created.text
    wait_for_admission_state(cluster_b.kubectl, team_b, "in_budget")
    # b's admin grants its team-x a lift, and tries the pool itself: neither moves what the hub's admin set.
    lift = {"gpu_minutes": 1000, "reason": "lift"}
    granted = hub.request("POST", f"/namespaces/{team_b}/grants", cluster_b.admin_token, "b", body=lift)
    assert granted.status_code == 201, granted.text
    raised = {**pool, "budget_gpu_minutes": 1000}
    assert hub.request("PUT", f"/pools/{POOL}", cluster_b.admin_token, "b", body=raised).status_code == 403

    trainer = gpu_pod(cluster_a, team_a, "trainer")
    token = sidecar_token(cluster_a.core, trainer)
    answers = [hub.report(token, None, trainer, seq) for seq in (1, 2, 3)]

    assert [a.status_code for a in answers] == [200, 200, 200], answers[-1].text
    assert answers[-1].json()["state"] == "exhausted"
    assert hub.charged(cluster_a, team_a) == 3 and hub.charged(cluster_b, team_b) == 0
    spent = hub.ok("GET", f"/pools/{POOL}", cluster_a.admin_token)
    assert spent["state"] == "exhausted"
    assert {m["namespace"]: Decimal(str(m["used_gpu_minutes"])) for m in spent["members"]} == {
        "team-x": 3,
        "b/team-x": 0,
    }
    # Within b's webhook's poll interval: b's team-x is exhausted, spent in a alone.
    wait_for_admission_state(cluster_b.kubectl, team_b, "exhausted")
    reduced = gpu_pod(cluster_b, team_b, "trainer")
    assert reduced["spec"]["priorityClassName"] == DEFAULT_OVER_BUDGET_PRIORITY_CLASS
    assert reduced["metadata"]["annotations"][ANNOTATION_BUDGET_STATE] == "exhausted"
    # As b's own admin sees it: b's team-x, spent nothing, exhausted by its pool.
    status = hub.ok("GET", f"/namespaces/{team_b}/budget", cluster_b.admin_token, "b")
    assert status["state"] == "exhausted"
    # b's pool read: the pool's totals, b's own member's figures only.
    seen = hub.ok("GET", f"/namespaces/{team_b}/pool", cluster_b.admin_token, "b")
    assert (seen["used_gpu_minutes"], seen["granted_gpu_minutes"]) == (3.0, 0.0)
    assert [member["namespace"] for member in seen["members"]] == ["b/team-x"]


def test_a_sidecar_token_of_cluster_a_reports_for_no_pod_of_cluster_b(
    cluster_a: Member, cluster_b: Member, hub: Hub, webhook_b: WebhookProcess
) -> None:
    """The token is bound to a's pod by a's API server: named as b's, b's API server refuses it (401);
    named as a's (the hub's own, no header), it may report for its own pod only (403)."""
    team_a, team_b = namespace_in(cluster_a, "team-t"), namespace_in(cluster_b, "team-t")
    ours, theirs = gpu_pod(cluster_a, team_a, "trainer"), gpu_pod(cluster_b, team_b, "trainer")
    token = sidecar_token(cluster_a.core, ours)

    as_b = hub.report(token, "b", theirs, 1)
    as_a = hub.report(token, None, theirs, 2)
    own_pod_as_b = hub.report(token, "b", ours, 4)
    unknown = hub.report(token, "c", ours, 5)

    assert (as_b.status_code, own_pod_as_b.status_code) == (401, 401)
    assert as_a.status_code == 403
    assert unknown.status_code == 400 and "not a member cluster" in unknown.text
    assert hub.charged(cluster_b, team_b) == 0
    # The same token reports for its own pod, charged to a's namespace only.
    assert hub.report(token, None, ours, 6).status_code == 200
    assert (hub.charged(cluster_a, team_a), hub.charged(cluster_b, team_b)) == (1, 0)
    # And b's own sidecar token, named as b's, reports for b's pod.
    assert hub.report(sidecar_token(cluster_b.core, theirs), "b", theirs, 7).status_code == 200
    assert hub.charged(cluster_b, team_b) == 1


def test_a_namespace_reader_of_cluster_a_cannot_read_cluster_bs_budget(
    cluster_a: Member, cluster_b: Member, hub: Hub
) -> None:
    """A RoleBinding in a's team-r to read gpubudgets there: the hub asks a's API server, about a's
    namespace; the same namespace of b is b's to answer, and b knows no such user."""
    team_a, team_b = namespace_in(cluster_a, "team-r"), namespace_in(cluster_b, "team-r")
    kubectl = cluster_a.kubectl
    kubectl.run("create", "serviceaccount", "reader", "-n", team_a)
    # A Role by object: `kubectl create role` looks the resource up, and this member serves no GPUBudget CRD.
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "budget-reader", "namespace": team_a},
        "rules": [
            {"apiGroups": ["gpu-timekeeper.io"], "resources": ["gpubudgets"], "verbs": ["get", "list"]}
        ],
    }
    kubectl.create(role)
    kubectl.run(
        "create",
        "rolebinding",
        "reader",
        "--role=budget-reader",
        f"--serviceaccount={team_a}:reader",
        "-n",
        team_a,
    )
    reader = service_account_token(cluster_a.core, team_a, "reader")
    hub.ok("PUT", f"/namespaces/{team_a}/budget", cluster_a.admin_token, body={"budget_gpu_minutes": 11})
    hub.ok("PUT", f"/namespaces/{team_b}/budget", cluster_b.admin_token, "b", body={"budget_gpu_minutes": 77})

    own = hub.request("GET", f"/namespaces/{team_a}/budget", reader)
    as_b = hub.request("GET", f"/namespaces/{team_b}/budget", reader, "b")
    by_key = hub.request("GET", f"/namespaces/{quote('b/team-r', safe='')}/budget", reader)
    listed = hub.request("GET", "/namespaces", reader)
    write = hub.request("PUT", f"/namespaces/{team_a}/budget", reader, body={"budget_gpu_minutes": 10**6})

    assert own.status_code == 200 and Decimal(str(own.json()["budget_gpu_minutes"])) == 11
    assert as_b.status_code == 401
    assert by_key.status_code in (404, 422)
    assert listed.status_code == 200
    assert [(n["cluster"], n["namespace"]) for n in listed.json()] == [(None, "team-r")]  # a's only
    assert "b/" not in listed.text
    assert write.status_code == 403
    # b's admin, for b, reads b's figure: it is there, and the reader never saw it.
    status = hub.ok("GET", f"/namespaces/{team_b}/budget", cluster_b.admin_token, "b")
    assert Decimal(str(status["budget_gpu_minutes"])) == 77
    # The audit log tells b's admin from a's (both `kube-admin`): by the cluster that authenticated each.
    audit = hub.ok("GET", "/audit?limit=2", cluster_a.admin_token)
    assert [(e["namespace"], e["actor_cluster"]) for e in audit] == [("b/team-r", "b"), ("team-r", None)]
    assert audit[0]["actor"] == audit[1]["actor"]


def test_one_api_server_under_two_names_is_refused_and_a_member_down_is_a_503(
    cluster_a: Member, cluster_b: Member, member_install: MemberInstall, tmp_path: Path
) -> None:
    """A second hub, misconfigured: member `a2` is its own cluster (a's API server), `b` and `b2` are b's
    API server through two kubeconfigs (the member's token, b's admin's), and `down`'s kubeconfig points at
    a closed port. It starts, serves its own cluster, and refuses each of those members with a 503 that
    names the cluster it duplicates (the identity, kube-system's uid, read with the RBAC deployment/member
    ships), or says that the member's API server does not answer (never a 401 or a 500)."""
    down = yaml.safe_load(member_install.hub_kubeconfig.read_text())
    down["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    (tmp_path / "down.kubeconfig").write_text(yaml.safe_dump(down))
    members = {
        "a2": cluster_a.plane.kubeconfig,
        "b": member_install.hub_kubeconfig,
        "b2": kubeconfig_for_token(cluster_b.plane, cluster_b.admin_token, tmp_path / "b2.kubeconfig"),
        "down": tmp_path / "down.kubeconfig",
    }
    with migrated_database("gtk_fleet_twice") as database:
        process = TimekeeperProcess(database, hub_env(cluster_a, members), free_port(), tmp_path / "hub.log")
        process.start()
        try:
            twice = Hub(process)
            answers = {
                cluster: twice.request("GET", "/namespaces/team-q/budget", member.admin_token, cluster)
                for cluster, member in (
                    ("a2", cluster_a),
                    ("b", cluster_b),
                    ("b2", cluster_b),
                    ("down", cluster_b),
                )
            }
            own = twice.request("GET", "/namespaces/team-q/budget", cluster_a.admin_token)
        finally:
            process.stop()

    assert own.status_code == 200, own.text
    assert {cluster: answer.status_code for cluster, answer in answers.items()} == dict.fromkeys(answers, 503)
    for cluster, other in (
        ("a2", "the hub's own cluster"),
        ("b", "member cluster b2"),
        ("b2", "member cluster b"),
    ):
        assert f"member cluster {cluster} is the same cluster as {other}" in answers[cluster].json()["detail"]
    assert "member cluster down cannot" in answers["down"].json()["detail"]
    assert answers["down"].headers["retry-after"]
    assert "cluster_configured_twice" in (tmp_path / "hub.log").read_text()


def sidecar_of(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == SIDECAR_CONTAINER_NAME)


def probe_state(kubectl: Kubectl, namespace: str) -> str:
    probe = kubectl.create(gpu_probe(namespace), "--dry-run=server")
    return str(probe["metadata"]["annotations"][ANNOTATION_BUDGET_STATE])


def test_with_the_hub_stopped_b_keeps_deciding_and_its_sidecars_reports_arrive_after_once(
    cluster_b: Member, hub: Hub, webhook_b: WebhookProcess, tmp_path: Path
) -> None:
    """Last in the module: it stops the hub. The sidecar is the real process, run from the container b's
    webhook injected (its SIDECAR_CLUSTER included) with a pod-bound token of b."""
    team = namespace_in(cluster_b, "team-h")
    hub.ok("PUT", f"/namespaces/{team}/budget", cluster_b.admin_token, "b", body={"budget_gpu_minutes": 0})
    wait_for_admission_state(cluster_b.kubectl, team, "exhausted")
    pod = gpu_pod(cluster_b, team, "trainer")
    assert {"name": "SIDECAR_CLUSTER", "value": "b"} in sidecar_of(pod)["env"]
    root = tmp_path / "sidecar"
    env = sidecar_env(pod, root, sidecar_token(cluster_b.core, pod)) | {
        "SIDECAR_SAMPLE_INTERVAL_SECONDS": "0.2",
        "SIDECAR_RETRY_BASE_SECONDS": "0.2",
        "SIDECAR_RETRY_MAX_SECONDS": "0.5",
        "SIDECAR_LOG_FORMAT": "json",
    }
    assert env["SIDECAR_TIMEKEEPER_URL"] == hub.process.url and env["SIDECAR_CLUSTER"] == "b"
    pending = Path(env["SIDECAR_BUFFER_DIR"]) / "pending"
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    try:
        wait_until(lambda: hub.charged(cluster_b, team) > 0, timeout=30, what="the sidecar's first charge")
        hub.process.stop()
        try:
            failed = polls_failed(webhook_b)
            wait_until(
                lambda: len(list(pending.glob("*.json"))) >= 2,
                timeout=30,
                what="reports buffered in the sidecar",
            )
            wait_until(
                lambda: polls_failed(webhook_b) > failed, timeout=30, what="b's webhook failing to poll"
            )
            assert probe_state(cluster_b.kubectl, team) == "exhausted"  # the last state it had
            assert "timekeeper_unreachable" in sidecar.event_names()
        finally:
            hub.process.start()
        wait_until(
            lambda: not list(pending.glob("*.json")), timeout=30, what="the buffered reports delivered"
        )
        assert probe_state(cluster_b.kubectl, team) == "exhausted"
    finally:
        assert sidecar.terminate() == 0
    assert not list(pending.glob("*.json"))
    state = persisted_state(Path(env["SIDECAR_BUFFER_DIR"]))
    covered_minutes = Decimal(state["covered_until_us"] - state["anchor_us"]) / Decimal(60_000_000)
    # Charged once: the share (1 GPU) for exactly the time the sidecar covered, to the nano-GPU-minute each.
    assert abs(hub.charged(cluster_b, team) - covered_minutes) <= state["next_seq"] * NANO


def polls_failed(webhook: WebhookProcess) -> float:
    """The webhook's failed polls of the hub so far (webhook_state_polls_total{result="error"})."""
    for line in webhook.client.get(f"{webhook.url}/metrics").text.splitlines():
        if line.startswith('webhook_state_polls_total{result="error"}'):
            return float(line.split()[-1])
    return 0.0
