"""docs/sidecar.md's matrix of sharing systems and the node-agent tests stay in step: every pod the tests
run is a row of the matrix, and every row that names a test names a pod the tests run."""

from __future__ import annotations

import re

from tests.nodeagent.test_pods import KUBELET_PODS, PODS
from tests.support.processes import REPO_ROOT


def matrix_rows() -> list[list[str]]:
    text = (REPO_ROOT / "docs" / "sidecar.md").read_text(encoding="utf-8")
    section = text.split("### Matrix", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].split("|")[1:-1]]
    assert header[-1] == "test"
    return [[cell.strip() for cell in row.split("|")[1:-1]] for row in rows[2:]]


def test_every_tested_pod_is_a_row_and_every_named_test_exists() -> None:
    named = {name for row in matrix_rows() for name in re.findall(r"`([\w-]+)`", row[-1])}
    assert named == set(PODS)
    assert set(PODS) <= {pod.name for pod in KUBELET_PODS}
