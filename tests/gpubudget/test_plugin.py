"""The console scripts as installed: `gpu-budget`, and `kubectl-gpu_budget`, which kubectl finds on the
PATH and runs for `kubectl gpu-budget`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.gpubudget.conftest import Seeded
from tests.support.processes import REPO_ROOT

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent  # the venv's bin, where pip put the console scripts
KUBECTL = shutil.which("kubectl", path="/usr/bin:/usr/local/bin") or "/usr/bin/kubectl"


def env_with_bin(home: Path) -> dict[str, str]:
    """Only the venv's bin and the system's on PATH; a HOME of its own, so no user's kubeconfig or
    plugins take part."""
    return {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(home), "KUBECONFIG": str(home / "absent")}


def test_gpu_budget_is_installed_as_a_console_script(timekeeper: Seeded, tmp_path: Path) -> None:
    result = subprocess.run(
        [BIN / "gpu-budget", "status", "cli-train", "-o", "json"],
        env=env_with_bin(tmp_path)
        | {"GPU_BUDGET_URL": timekeeper.url, "GPU_BUDGET_TOKEN": timekeeper.tokens.reader},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["namespace"] == "cli-train"


@pytest.mark.skipif(not os.access(KUBECTL, os.X_OK), reason="no kubectl on this machine")
def test_kubectl_plugin_list_finds_gpu_budget(tmp_path: Path) -> None:
    result = subprocess.run(
        [KUBECTL, "plugin", "list"], env=env_with_bin(tmp_path), capture_output=True, text=True, timeout=60
    )

    assert str(BIN / "kubectl-gpu_budget") in result.stdout.splitlines()
    assert "kubectl-gpu_budget" not in result.stderr  # no warning about it (shadowed, not executable)


@pytest.mark.skipif(not os.access(KUBECTL, os.X_OK), reason="no kubectl on this machine")
def test_kubectl_gpu_budget_runs_the_plugin(timekeeper: Seeded, tmp_path: Path) -> None:
    result = subprocess.run(
        [KUBECTL, "gpu-budget", "forecast", "cli-train", "-o", "json"],
        env=env_with_bin(tmp_path)
        | {"GPU_BUDGET_URL": timekeeper.url, "GPU_BUDGET_TOKEN": timekeeper.tokens.reader},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["forecast"]["window_minutes"] == 360


def test_without_a_url_or_kubeconfig_the_error_says_what_to_give(tmp_path: Path) -> None:
    result = subprocess.run(
        [BIN / "gpu-budget", "status"], env=env_with_bin(tmp_path), capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 2
    assert result.stderr.startswith(
        "error: no timekeeper URL (--url or GPU_BUDGET_URL) and no usable kubeconfig"
    )


def test_the_krew_manifest_installs_the_same_command_kubectl_finds() -> None:
    manifest = yaml.safe_load((REPO_ROOT / "deployment" / "krew" / "gpu-budget.yaml").read_text())
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]

    assert manifest["kind"] == "Plugin" and manifest["metadata"]["name"] == "gpu-budget"
    # kubectl maps `kubectl gpu-budget` to an executable named kubectl-gpu_budget.
    [platform] = manifest["spec"]["platforms"]
    assert platform["bin"] == "kubectl-gpu_budget"
    assert scripts["kubectl-gpu_budget"] == scripts["gpu-budget"] == "gpubudget.commands:main"
