"""The cluster layer: a real kube-apiserver 1.20 (+ etcd, kube-controller-manager) started once for this
package, our shipped manifests applied to it, and our processes running locally against it — the
timekeeper in `kubernetes` auth mode on a real PostgreSQL, the webhook over HTTPS with the certificate the
self-signed bootstrap issued and registered.

Every test here is marked `cluster` (and `e2e`). When no control plane can start, the whole layer is skipped
with one line saying why (CI sets TIMEKEEPER_TEST_REQUIRE_CLUSTER=1: there it fails instead).

For a new test: ask for `namespace` (a fresh namespace, with the webhook and the timekeeper running), then
drive the cluster with `kubectl` (the real CLI, as cluster admin), `kube` (the `kubernetes` client) or
`tenant` (a member of the namespace with only the built-in `edit` role, writing with its own token), and
budgets with `api` (`api.set_budget(namespace, 0)` makes it exhausted; `wait_for_admission_state`
waits until the webhook decides with it).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from tests.cluster.harness import (
    INSTALL_NAMESPACE,
    SILENT_GRACE_SECONDS,
    TOKEN_SECONDS,
    Install,
    Kubectl,
    Tenant,
    TimekeeperApi,
    WebhookTls,
    install_source,
    render_chart,
    render_manifests,
    run_certbootstrap,
    service_account_kubeconfig,
    service_account_token,
    tenant_in,
)
from tests.support.control_plane import Background, ControlPlane, Unavailable, required
from tests.support.processes import TimekeeperProcess, WebhookProcess, free_port, wait_until
from tests.support.timekeeper import migrated_database

HERE = Path(__file__).resolve().parent


SKIPPED = "cluster layer skipped: "
STARTED = pytest.StashKey[Background]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """The control plane starts as soon as the run is known to include this layer, while the tests before
    it run; the `control_plane` fixture waits for it."""
    if session.config.option.collectonly:
        return
    if any(HERE in item.path.parents for item in session.items):
        # tmp_path_factory's own object (the fixture answers the same), for the usual kept folders.
        factory: pytest.TempPathFactory = session.config._tmp_path_factory  # type: ignore[attr-defined]
        session.config.stash[STARTED] = Background(factory.mktemp("kube-cp"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Its `down`, begun when the layer's last test was done, has finished before the run ends."""
    if (started := session.config.stash.get(STARTED, None)) is not None:
        started.wait_stopped()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Iterator[pytest.TestReport]:
    """Every test the layer skips for want of a control plane is reported at one place, so `-ra` folds
    them into one line."""
    report: pytest.TestReport = yield
    if report.skipped and isinstance(report.longrepr, tuple) and report.longrepr[2].startswith(SKIPPED):
        report.longrepr = (__file__, 0, report.longrepr[2])
    return report


@pytest.fixture(scope="package")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """The control plane pytest_collection_finish started; stopped in the background after the layer."""
    started = request.config.stash[STARTED]
    try:
        plane = started.plane()
    except Unavailable as error:
        if required():
            pytest.fail(f"cluster layer: {error}", pytrace=False)
        pytest.skip(f"{SKIPPED}{error}")
    yield plane
    started.stop()


@pytest.fixture(scope="package")
def kube(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    """The `kubernetes` client as cluster admin."""
    api_client = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    yield api_client
    api_client.close()


@pytest.fixture(scope="package")
def core(kube: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(kube)


@pytest.fixture(scope="package")
def kubectl(control_plane: ControlPlane) -> Kubectl:
    return Kubectl(control_plane.kubeconfig)


@pytest.fixture(scope="package")
def install(kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Install:
    """Our shipped manifests applied with kubectl: the kustomize base (tests/cluster/kustomization.yaml), or
    with TIMEKEEPER_TEST_CLUSTER_INSTALL=helm the chart as `harness.render_chart` renders it, into the
    namespace `helm install --create-namespace` would make. `--validate=false`: kubectl's own check
    against 1.20's schema refuses `matchConditions`, which this API server drops."""
    source = install_source()
    port = free_port()
    folder = tmp_path_factory.mktemp("manifests")
    if source == "helm":
        manifests = render_chart(f"https://127.0.0.1:{port}", folder)
        kubectl.run("create", "namespace", INSTALL_NAMESPACE)
    else:
        manifests = render_manifests(f"https://127.0.0.1:{port}", folder)
    kubectl.run("apply", "--validate=false", "-f", "-", stdin=manifests)
    return Install(port, manifests, source)


@pytest.fixture(scope="package")
def webhook_tls(
    control_plane: ControlPlane,
    core: client.CoreV1Api,
    install: Install,
    tmp_path_factory: pytest.TempPathFactory,
) -> WebhookTls:
    """The serving certificate from `python -m webhook.certbootstrap`, run as the bootstrap's own
    ServiceAccount: it creates the CA and TLS Secrets and patches both configurations' caBundle, which is
    how the API server comes to trust the webhook at all."""
    folder = tmp_path_factory.mktemp("webhook-tls")
    kubeconfig = service_account_kubeconfig(control_plane, core, "gpu-timekeeper-certbootstrap", folder)
    run_certbootstrap(kubeconfig)
    secret = core.read_namespaced_secret("gpu-timekeeper-webhook-tls", INSTALL_NAMESPACE)
    data = {key: base64.b64decode(value) for key, value in secret.data.items()}
    (folder / "tls.crt").write_bytes(data["tls.crt"])
    (folder / "tls.key").write_bytes(data["tls.key"])
    (folder / "tls.key").chmod(0o600)
    return WebhookTls(folder / "tls.crt", folder / "tls.key", data["ca.crt"])


@pytest.fixture(scope="package")
def timekeeper(
    control_plane: ControlPlane,
    core: client.CoreV1Api,
    install: Install,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TimekeeperProcess]:
    """`python -m timekeeper` in `kubernetes` auth mode as deployment/'s gpu-timekeeper ServiceAccount, with
    the reconcile pass (pod watch, silent time, quotas, Events), the state sweep and the GPUBudget sync
    every second."""
    folder = tmp_path_factory.mktemp("timekeeper")
    kubeconfig = service_account_kubeconfig(control_plane, core, "gpu-timekeeper", folder)
    env = {
        "TIMEKEEPER_AUTH_MODE": "kubernetes",
        "TIMEKEEPER_METRICS_AUTH": "token",  # as deployment/ ships it: the budgets on /metrics are private
        "TIMEKEEPER_KUBE_IN_CLUSTER": "false",
        "TIMEKEEPER_KUBECONFIG": str(kubeconfig),
        "TIMEKEEPER_RECONCILE": "true",
        "TIMEKEEPER_RECONCILE_INTERVAL_SECONDS": "1",
        "TIMEKEEPER_SILENT_GRACE_SECONDS": str(SILENT_GRACE_SECONDS),
        "TIMEKEEPER_LEADER_RETRY_INTERVAL": "0.5",
        # One process: a check slow on a loaded machine would drop and retake leadership, and a new
        # leadership learns the budget states anew (Events for changes in between are not posted).
        "TIMEKEEPER_LEADER_CHECK_TIMEOUT": "10",
        "TIMEKEEPER_STATES_INTERVAL": "1",  # the state sweep the pass's Events compare
        "TIMEKEEPER_GITOPS": "true",  # GPUBudget objects (deployment/'s CRDs), a pass every second
        "TIMEKEEPER_GITOPS_INTERVAL_SECONDS": "1",
        "TIMEKEEPER_GITOPS_STATUS_INTERVAL_SECONDS": "0",  # figures written as soon as they move
        "TIMEKEEPER_LOG_FORMAT": "json",
        # A tenant's PodDisruptionBudget refuses a downgrade for 10 s, then its pod is deleted
        # (tests/cluster/test_tenant_enforcement.py; test_eviction.py's guarded pod is checked before).
        "TIMEKEEPER_DOWNGRADE_PDB_PATIENCE_SECONDS": "10",
    }
    with migrated_database("gtk_cluster") as database:
        process = TimekeeperProcess(database, env, free_port(), folder / "timekeeper.log")
        process.start()
        yield process
        process.stop()


@pytest.fixture(scope="package")
def api(timekeeper: TimekeeperProcess, control_plane: ControlPlane) -> TimekeeperApi:
    """The timekeeper's API as the cluster admin (system:masters: every SubjectAccessReview allows it)."""
    return TimekeeperApi(timekeeper.url, control_plane.admin_token)


def start_webhook(
    control_plane: ControlPlane,
    core: client.CoreV1Api,
    webhook_tls: WebhookTls,
    timekeeper: TimekeeperProcess,
    folder: Path,
    port: int,
    **env: str,
) -> WebhookProcess:
    """`python -m webhook` on `port` as deployment/'s webhook ServiceAccount (its token for the timekeeper,
    its kubeconfig for the watches: exactly the RBAC deployment/ ships), with `env` over the defaults;
    returned once it has its first admission state."""
    token = service_account_token(
        core,
        INSTALL_NAMESPACE,
        "gpu-timekeeper-webhook",
        audiences=("gpu-timekeeper",),
        seconds=TOKEN_SECONDS,
    )
    (folder / "token").write_text(token)
    defaults = {
        "WEBHOOK_KUBECONFIG": str(
            service_account_kubeconfig(control_plane, core, "gpu-timekeeper-webhook", folder)
        ),
        "WEBHOOK_TLS_CERT_FILE": str(webhook_tls.cert),
        "WEBHOOK_TLS_KEY_FILE": str(webhook_tls.key),
        "WEBHOOK_TIMEKEEPER_URL": timekeeper.url,
        "WEBHOOK_TIMEKEEPER_TOKEN_FILE": str(folder / "token"),
        "WEBHOOK_STATE_POLL_INTERVAL_SECONDS": "0.2",
        "WEBHOOK_SIDECAR_MODE": "container",
        "WEBHOOK_LOG_FORMAT": "json",
    }
    process = WebhookProcess({**defaults, **env}, port, webhook_tls.ca, folder / "webhook.log")
    process.start()
    wait_until(
        lambda: "webhook_state_age_seconds -1.0" not in process.client.get(f"{process.url}/metrics").text,
        timeout=30,
        what="the webhook's first admission state",
    )
    return process


@pytest.fixture(scope="package")
def webhook(
    control_plane: ControlPlane,
    core: client.CoreV1Api,
    install: Install,
    webhook_tls: WebhookTls,
    timekeeper: TimekeeperProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WebhookProcess]:
    """`python -m webhook` where the shipped configurations point, injecting the sidecar as a plain
    container (1.20 has no native sidecars) and polling the timekeeper with a token of its own
    ServiceAccount for audience gpu-timekeeper (the timekeeper reviews it; the shipped viewer binding
    lets it read every namespace's state), and watching PriorityClasses as that ServiceAccount."""
    folder = tmp_path_factory.mktemp("webhook")
    process = start_webhook(control_plane, core, webhook_tls, timekeeper, folder, install.webhook_port)
    yield process
    process.stop()


@pytest.fixture
def namespace(
    core: client.CoreV1Api, kubectl: Kubectl, webhook: WebhookProcess, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh namespace, ready for pods (its default ServiceAccount and token exist), with the webhook and
    the timekeeper running; deleted afterwards."""
    name = f"t-{request.node.name[:40].lower().strip('_-')}-{time.monotonic_ns() % 10**6}"
    name = "".join(c if c.isalnum() or c == "-" else "-" for c in name)
    kubectl.run("create", "namespace", name)

    def ready() -> bool:
        accounts = core.list_namespaced_service_account(name).items
        return any(a.metadata.name == "default" and a.secrets for a in accounts)

    wait_until(ready, timeout=30, what=f"the default ServiceAccount of {name}")
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false")


@pytest.fixture
def tenant(
    control_plane: ControlPlane, kubectl: Kubectl, core: client.CoreV1Api, namespace: str, tmp_path: Path
) -> Tenant:
    """`namespace` as a hostile tenant acts in it: `edit` there only, every write with its own token."""
    return tenant_in(control_plane, kubectl, core, namespace, tmp_path)
