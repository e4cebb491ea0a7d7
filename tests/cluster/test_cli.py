"""`kubectl gpu-budget` through the kubeconfig: the API server's service proxy forwards to the timekeeper,
and RBAC applies twice — the API server decides who may use the proxy (`services/proxy`), the timekeeper
(TokenReview, SubjectAccessReview) what the user may read or change.

The timekeeper runs locally in `kubernetes` auth mode on this machine's own address (an Endpoints object
may not name a loopback address), behind a selector-less Service whose Endpoints point at it."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from gpubudget.commands import main
from tests.cluster.harness import (
    INSTALL_NAMESPACE,
    Kubectl,
    kubeconfig_for_token,
    service_account_kubeconfig,
    service_account_token,
    set_status,
)
from tests.support.control_plane import ControlPlane
from tests.support.processes import TimekeeperProcess, free_port
from tests.support.timekeeper import migrated_database

SERVICE = "gpu-timekeeper-cli"
PROXY_ROLE = "gpu-budget-cli-proxy"


def own_address() -> str | None:
    """The address this machine's default route leaves from (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


@dataclass(frozen=True)
class Proxied:
    service: str
    namespace: str  # a namespace whose budget the tests set
    folder: Path


@pytest.fixture(scope="module")
def proxied(
    control_plane: ControlPlane,
    core: client.CoreV1Api,
    kubectl: Kubectl,
    webhook: object,  # admits the stand-in pod below (every namespace's pods pass through it on 1.20)
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Proxied]:
    address = own_address()
    if address is None:
        pytest.skip("no non-loopback address for the Service's Endpoints")
    folder = tmp_path_factory.mktemp("cli")
    port = free_port()
    env = {
        "TIMEKEEPER_AUTH_MODE": "kubernetes",
        "TIMEKEEPER_KUBE_IN_CLUSTER": "false",
        "TIMEKEEPER_KUBECONFIG": str(
            service_account_kubeconfig(control_plane, core, "gpu-timekeeper", folder)
        ),
        "TIMEKEEPER_SCHEDULER_ENABLED": "false",
    }
    namespace = f"cli-{time.monotonic_ns() % 10**6}"
    objects = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": SERVICE, "namespace": INSTALL_NAMESPACE},
            "spec": {"containers": [{"name": "timekeeper", "image": "gpu-timekeeper:local"}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": INSTALL_NAMESPACE},
            "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": port}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": SERVICE, "namespace": INSTALL_NAMESPACE},
            "subsets": [
                {
                    "addresses": [
                        {
                            "ip": address,
                            "targetRef": {"kind": "Pod", "name": SERVICE, "namespace": INSTALL_NAMESPACE},
                        }
                    ],
                    "ports": [{"name": "http", "port": port}],
                }
            ],
        },
        # docs/cli.md: who may use `kubectl gpu-budget` through the API server.
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": PROXY_ROLE, "namespace": INSTALL_NAMESPACE},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["services/proxy"],
                    # The API server authorises a proxy request by the whole `scheme:name:port` it names.
                    "resourceNames": [f"http:{SERVICE}:8080"],
                    "verbs": ["get", "create", "update", "delete"],
                }
            ],
        },
    ]
    kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
    # The API server proxies only to an endpoint backed by a pod with that IP: the pod a kubelet would run
    # (there is none here), its status written as a kubelet would.
    set_status(kubectl, INSTALL_NAMESPACE, SERVICE, {"podIP": address, "podIPs": [{"ip": address}]})
    with migrated_database("gtk_cluster_cli") as database:
        process = TimekeeperProcess(database, env, port, folder / "timekeeper.log", host=address)
        process.start()
        try:
            yield Proxied(f"{INSTALL_NAMESPACE}/{SERVICE}:8080", namespace, folder)
        finally:
            process.stop()
            kubectl.run(
                "delete", "-f", "-", "--wait=false", "--ignore-not-found", stdin=yaml.safe_dump_all(objects)
            )


def user(
    control_plane: ControlPlane,
    core: client.CoreV1Api,
    kubectl: Kubectl,
    proxied: Proxied,
    name: str,
    *roles: str,
) -> Path:
    """A ServiceAccount in the test namespace as a kubeconfig user with a token (the API server's own
    audience, as `kubectl create token` gives), bound to the given roles: `proxy` (the Role above),
    `viewer` (gpu-timekeeper-viewer in the test namespace), `admin` (gpu-timekeeper-admin cluster-wide)."""
    kubectl.run("create", "serviceaccount", name, "-n", proxied.namespace)
    subject = f"--serviceaccount={proxied.namespace}:{name}"
    if "proxy" in roles:
        kubectl.run(
            "create", "rolebinding", f"{name}-proxy", "-n", INSTALL_NAMESPACE, f"--role={PROXY_ROLE}", subject
        )
    if "viewer" in roles:
        kubectl.run(
            "create",
            "rolebinding",
            f"{name}-viewer",
            "-n",
            proxied.namespace,
            "--clusterrole=gpu-timekeeper-viewer",
            subject,
        )
    if "admin" in roles:
        kubectl.run(
            "create",
            "clusterrolebinding",
            f"{proxied.namespace}-{name}",
            "--clusterrole=gpu-timekeeper-admin",
            subject,
        )
    token = service_account_token(core, proxied.namespace, name)
    return kubeconfig_for_token(control_plane, token, proxied.folder / f"{name}.kubeconfig")


def run(
    capsys: pytest.CaptureFixture[str], kubeconfig: Path, proxied: Proxied, *args: str
) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--kubeconfig", str(kubeconfig), "--service", proxied.service, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_cluster_admin_reads_and_changes_budgets_through_the_api_server(
    control_plane: ControlPlane, proxied: Proxied, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = kubeconfig_for_token(
        control_plane, control_plane.admin_token, proxied.folder / "admin.kubeconfig"
    )
    ns = proxied.namespace

    set_code, _, set_err = run(capsys, admin, proxied, "set", ns, "--budget", "300", "-o", "json")
    grant_code, granted, grant_err = run(
        capsys, admin, proxied, "grant", ns, "25", "--reason", "demo", "-o", "json"
    )
    code, out, err = run(capsys, admin, proxied, "status", "-o", "json")

    assert (set_code, grant_code, code) == (0, 0, 0), set_err + grant_err + err
    assert json.loads(granted)["budget"]["remaining_gpu_minutes"] == 325
    assert {entry["namespace"]: entry["budget_gpu_minutes"] for entry in json.loads(out)}[ns] == 300
    code, out, _ = run(capsys, admin, proxied, "audit", "-n", ns, "-o", "json")
    assert code == 0
    assert [entry["action"] for entry in json.loads(out)] == ["grant.create", "budget.put"]


def test_a_namespace_viewer_reads_its_budget_but_may_not_change_it(
    control_plane: ControlPlane,
    core: client.CoreV1Api,
    kubectl: Kubectl,
    proxied: Proxied,
    capsys: pytest.CaptureFixture[str],
) -> None:
    viewer = user(control_plane, core, kubectl, proxied, "viewer", "proxy", "viewer")
    admin = kubeconfig_for_token(
        control_plane, control_plane.admin_token, proxied.folder / "admin.kubeconfig"
    )
    known, _, known_err = run(capsys, admin, proxied, "set", proxied.namespace, "--budget", "300")
    assert known == 0, known_err  # the timekeeper knows the namespace, so lists it

    code, out, err = run(capsys, viewer, proxied, "status", proxied.namespace, "-o", "json")
    refused, _, refusal = run(capsys, viewer, proxied, "set", proxied.namespace, "--budget", "1000000")
    listed, listing, listing_err = run(capsys, viewer, proxied, "status", "-o", "json")

    assert code == 0, err
    assert json.loads(out)["namespace"] == proxied.namespace
    assert refused == 1 and refusal.startswith("error: not allowed:") and "gpu-timekeeper-admin" in refusal
    # No cluster-wide read: the list is the namespaces the viewer may read (docs/kubernetes.md).
    assert listed == 0, listing_err
    assert [entry["namespace"] for entry in json.loads(listing)] == [proxied.namespace]


def test_a_user_without_the_proxy_permission_is_told_what_the_api_server_refused(
    control_plane: ControlPlane,
    core: client.CoreV1Api,
    kubectl: Kubectl,
    proxied: Proxied,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stranger = user(control_plane, core, kubectl, proxied, "stranger", "viewer")

    code, _, err = run(capsys, stranger, proxied, "status", proxied.namespace)

    assert code == 1
    assert "the API server refused to forward to the timekeeper" in err and "services/proxy" in err


def test_a_client_certificate_user_is_told_to_give_a_token(
    control_plane: ControlPlane, proxied: Proxied, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, control_plane.kubeconfig, proxied, "status", proxied.namespace)

    assert code == 1
    assert "client certificate" in err and "--token" in err


def test_a_service_that_does_not_exist_is_named_in_the_error(
    control_plane: ControlPlane, proxied: Proxied, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = kubeconfig_for_token(
        control_plane, control_plane.admin_token, proxied.folder / "admin2.kubeconfig"
    )
    wrong = Proxied(f"{INSTALL_NAMESPACE}/no-such-service:8080", proxied.namespace, proxied.folder)

    code, _, err = run(capsys, admin, wrong, "status")

    assert code == 1
    assert "no timekeeper Service at service gpu-timekeeper/no-such-service:8080" in err
