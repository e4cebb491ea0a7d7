"""Render deployment/ with the real kustomize (`kustomize build`, else `kubectl kustomize`), once per run."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENT = ROOT / "deployment"
OVERLAYS = sorted(p.parent.name for p in (DEPLOYMENT / "overlays").glob("*/kustomization.yaml"))
# What each rendering must be, whatever the overlay: base alone is rendered to check it stays valid too.
BUILDS = ["base", *(f"overlays/{name}" for name in OVERLAYS)]


def kustomize_command() -> list[str] | None:
    if path := shutil.which("kustomize"):
        return [path, "build"]
    if path := shutil.which("kubectl"):
        return [path, "kustomize"]
    return None


@cache
def render(build: str) -> tuple[dict[str, Any], ...]:
    command = kustomize_command()
    if command is None:
        pytest.skip("neither kustomize nor kubectl is installed (python-svc machines ship kubectl)")
    done = subprocess.run(
        [*command, str(DEPLOYMENT / build)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"kustomize failed on {build}:\n{done.stderr}"
    return tuple(obj for obj in yaml.safe_load_all(done.stdout) if obj)


def find(objects: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def pod_specs(objects: tuple[dict[str, Any], ...]) -> list[tuple[str, dict[str, Any]]]:
    """Every pod template in the build, with the name of the object that holds it."""
    specs = []
    for obj in objects:
        spec = obj.get("spec", {})
        if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            specs.append((f"{obj['kind']}/{obj['metadata']['name']}", spec["template"]["spec"]))
        elif obj["kind"] == "CronJob":
            specs.append(
                (f"CronJob/{obj['metadata']['name']}", spec["jobTemplate"]["spec"]["template"]["spec"])
            )
    return specs
