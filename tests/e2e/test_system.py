"""The whole system over real sockets: the timekeeper on PostgreSQL, the webhook over HTTPS polling the
timekeeper's admission state, and the sidecar the webhook injected, run from the very env it injected.

A namespace with a tiny budget admits a GPU pod at the in-budget class, its sidecar spends the budget,
the next pod is admitted at the reduced class, an admin grant restores the budget and the pod after that
is in budget again; the namespace is charged exactly share x the time the sidecar covered.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import pytest

from demo.pods import sidecar_env
from gpuaccounting.names import ANNOTATION_GPU_SHARE
from tests.sidecar.coverage import persisted_state
from tests.support.pods import container, pod, review
from tests.support.processes import (
    LOCAL_HTTP,
    SidecarProcess,
    TimekeeperProcess,
    WebhookProcess,
    free_port,
    wait_until,
)
from tests.support.timekeeper import Tokens, bearer, migrated_database
from webhook.certificates.tls import generate_ca, generate_serving_cert

pytestmark = pytest.mark.e2e

NAMESPACE = "team-e2e"
BUDGET_GPU_MINUTES = Decimal("0.02")  # 1.2 GPU-seconds: a half-GPU pod spends it in a few 1-s reports
NANO = Decimal("0.000000001")


@dataclass
class System:
    timekeeper: TimekeeperProcess
    webhook_url: str
    webhook: httpx.Client
    tokens: Tokens
    workdir: Path

    def budget(self) -> dict[str, Any]:
        response = LOCAL_HTTP.get(
            f"{self.timekeeper.url}/api/v1/namespaces/{NAMESPACE}/budget",
            headers=bearer(self.tokens.reader),
            timeout=5,
        )
        assert response.status_code == 200, response.text
        return response.json()

    def admin(self, method: str, path: str, body: dict[str, Any]) -> None:
        response = LOCAL_HTTP.request(
            method,
            f"{self.timekeeper.url}/api/v1{path}",
            json=body,
            headers=bearer(self.tokens.admin),
            timeout=5,
        )
        assert response.status_code in (200, 201), response.text

    def review(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        response = self.webhook.post(f"{self.webhook_url}{path}", json=review(obj))
        assert response.status_code == 200, response.text
        return response.json()["response"]

    def admit(self, obj: dict[str, Any]) -> dict[str, Any]:
        """What the API server does: mutate, apply the patch, validate the final object."""
        mutation = self.review("/mutate", obj)
        assert mutation["allowed"], mutation
        patch = json.loads(base64.b64decode(mutation["patch"])) if "patch" in mutation else []
        admitted = jsonpatch.apply_patch(obj, patch)
        validation = self.review("/validate", admitted)
        assert validation["allowed"], validation
        admitted["metadata"]["uid"] = str(uuid.uuid4())  # the API server assigns it on create
        return admitted


def half_gpu_pod(name: str) -> dict[str, Any]:
    """Half a GPU, as KAI-Scheduler / Run:ai users ask for it."""
    return pod(container("train"), name=name, namespace=NAMESPACE, annotations={"gpu-fraction": "0.5"})


def run_env(admitted: dict[str, Any], system: System, name: str) -> dict[str, str]:
    """The injected container's env as the kubelet resolves it (the demo's resolution, demo/pods.py), its
    volumes folders under the test's workdir, sampling fast, logging JSON (SidecarProcess.events)."""
    root = system.workdir / name
    env = sidecar_env(admitted, root, system.tokens.reporter)
    assert Path(env["SIDECAR_TOKEN_FILE"]).is_relative_to(root)  # the token is read from its volume
    return env | {"SIDECAR_SAMPLE_INTERVAL_SECONDS": "0.2", "SIDECAR_LOG_FORMAT": "json"}


@pytest.fixture
def system(tmp_path: Path) -> Iterator[System]:
    tokens = Tokens()
    ca_cert, ca_key = generate_ca("e2e CA")
    cert, key = generate_serving_cert(
        ca_cert, ca_key, "gpu-timekeeper-webhook", "gpu-timekeeper", extra_sans=("127.0.0.1",)
    )
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    (tmp_path / "webhook-token").write_text(tokens.reader)
    with migrated_database("gtk_e2e") as database:
        timekeeper = TimekeeperProcess(database, tokens.env(), free_port(), tmp_path / "timekeeper.log")
        timekeeper.launch()
        webhook = WebhookProcess(
            {
                "WEBHOOK_TLS_CERT_FILE": str(tmp_path / "tls.crt"),
                "WEBHOOK_TLS_KEY_FILE": str(tmp_path / "tls.key"),
                "WEBHOOK_TIMEKEEPER_URL": timekeeper.url,
                "WEBHOOK_TIMEKEEPER_TOKEN_FILE": str(tmp_path / "webhook-token"),
                "WEBHOOK_STATE_POLL_INTERVAL_SECONDS": "0.2",
                # Started beside the timekeeper: a first poll before it listens is retried soon.
                "WEBHOOK_STATE_POLL_RETRY_MAX_SECONDS": "0.2",
                "WEBHOOK_SIDECAR_REPORT_INTERVAL_SECONDS": "1",
                "WEBHOOK_WATCH_PRIORITY_CLASSES": "false",  # no API server in this test
            },
            free_port(),
            ca_cert,
            tmp_path / "webhook.log",
        )
        try:
            webhook.launch()
            timekeeper.wait_healthy()
            webhook.wait_healthy()
            yield System(timekeeper, webhook.url, webhook.client, tokens, tmp_path)
        finally:
            webhook.stop()
            timekeeper.stop()


def test_a_namespace_spends_its_budget_and_its_next_pod_is_downgraded(system: System) -> None:
    # No period: on the system clock a monthly budget's use restarts at midnight on the 1st, and a run
    # crossing it would no longer match the time the sidecar covered.
    system.admin(
        "PUT",
        f"/namespaces/{NAMESPACE}/budget",
        {"budget_gpu_minutes": float(BUDGET_GPU_MINUTES), "period": "none", "warn_at_fraction": 0.5},
    )

    def next_class() -> str:
        return str(system.admit(half_gpu_pod(f"probe-{uuid.uuid4().hex[:6]}"))["spec"]["priorityClassName"])

    wait_until(lambda: next_class() == "gpu-in-budget", timeout=10, what="the webhook to see the budget")

    trainer = system.admit(half_gpu_pod("trainer-0"))
    assert trainer["spec"]["priorityClassName"] == "gpu-in-budget"
    assert trainer["metadata"]["annotations"][ANNOTATION_GPU_SHARE] == "0.5"
    env = run_env(trainer, system, "trainer-0")
    assert env["SIDECAR_GPU_SHARE"] == "0.5"
    assert env["SIDECAR_TIMEKEEPER_URL"] == system.timekeeper.url

    sidecar = SidecarProcess(env, system.workdir / "sidecar.log")
    wait_until(lambda: system.budget()["state"] == "exhausted", timeout=30, what="the budget to run out")
    wait_until(lambda: next_class() == "gpu-over-budget", timeout=10, what="the webhook to downgrade")
    assert sidecar.terminate() == 0

    charged = Decimal(str(system.budget()["used_gpu_minutes"]))
    state = persisted_state(Path(env["SIDECAR_BUFFER_DIR"]))
    covered_minutes = Decimal(state["covered_until_us"] - state["anchor_us"]) / Decimal(60_000_000)
    assert abs(charged - Decimal("0.5") * covered_minutes) <= state["next_seq"] * NANO
    assert charged >= BUDGET_GPU_MINUTES

    system.admin("POST", f"/namespaces/{NAMESPACE}/grants", {"gpu_minutes": 10, "reason": "e2e top-up"})
    assert system.budget()["state"] == "in_budget"
    wait_until(lambda: next_class() == "gpu-in-budget", timeout=10, what="the webhook to restore the class")
