"""The webhook against the real timekeeper (python -m timekeeper on a migrated PostgreSQL): the state it
polls with its token decides the class, and the namespace's cap set through the API is enforced."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.pods import container, pod
from tests.support.processes import TimekeeperProcess, free_port
from tests.support.timekeeper import Tokens, bearer, migrated_database, ok, sha256
from tests.webhook.conftest import Tls, serve_webhook

pytestmark = pytest.mark.e2e


def test_budget_set_in_the_timekeeper_reaches_admission(tls: Tls, tmp_path: Path) -> None:
    tokens = Tokens()
    env = {
        "TIMEKEEPER_AUTH_MODE": "static",
        "TIMEKEEPER_ADMIN_TOKEN_SHA256": sha256(tokens.admin),
        "TIMEKEEPER_READER_TOKEN_SHA256": sha256(tokens.reader),
        "TIMEKEEPER_REPORTER_TOKEN_SHA256": sha256(tokens.reporter),
    }
    with migrated_database("gtk_webhook") as url:
        timekeeper = TimekeeperProcess(url, env, free_port(), tmp_path / "timekeeper.log")
        timekeeper.start()
        token_file = tmp_path / "token"
        token_file.write_text(tokens.reader)
        try:
            with (
                httpx.Client(base_url=f"{timekeeper.url}/api/v1", timeout=10) as client,
                serve_webhook(
                    tls, None, timekeeper_url=timekeeper.url, timekeeper_token_file=token_file
                ) as hook,
            ):
                hook.wait_until(lambda: hook.metric("webhook_state_polls_total", result="updated") >= 1)
                gpu_pod = pod(container("train", {"nvidia.com/gpu": 2}))
                before = hook.admit(gpu_pod)
                assert before["spec"]["priorityClassName"] == "gpu-in-budget"

                version = hook.metric("webhook_state_version")
                body = {"budget_gpu_minutes": 0, "period": "monthly", "max_gpu_share_per_pod": 1.5}
                ok(client.put("/namespaces/team-a/budget", json=body, headers=bearer(tokens.admin)))
                hook.wait_until(lambda: hook.metric("webhook_state_version") > version)
                after = hook.admit(gpu_pod)
                assert after["spec"]["priorityClassName"] == "gpu-over-budget"
                assert after["spec"]["priority"] == 100
                denied = hook.validate(after)
                assert not denied.allowed and "per-pod cap of 1.5" in denied.message
                # An unchanged state is confirmed with a 304 (If-None-Match), not fetched again.
                hook.wait_until(lambda: hook.metric("webhook_state_polls_total", result="not_modified") >= 1)
        finally:
            timekeeper.stop()
