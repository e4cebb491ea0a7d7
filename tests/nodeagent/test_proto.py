"""The committed PodResources code is exactly what the pinned grpcio-tools generates from the vendored
proto, and the proto is upstream's (package `v1`, the service the kubelet registers)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from grpc_tools import protoc

from nodeagent.podresources.v1 import api_pb2
from tests.support.processes import REPO_ROOT

PACKAGE = Path("nodeagent/podresources/v1")
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def test_generated_code_matches_the_vendored_proto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regenerate as `python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=.
    nodeagent/podresources/v1/api.proto` from the repository root does."""
    (tmp_path / PACKAGE).mkdir(parents=True)
    shutil.copy(REPO_ROOT / PACKAGE / "api.proto", tmp_path / PACKAGE / "api.proto")
    monkeypatch.chdir(tmp_path)
    args = [
        "protoc",
        "-I.",
        "--python_out=.",
        "--pyi_out=.",
        "--grpc_python_out=.",
        str(PACKAGE / "api.proto"),
    ]
    assert protoc.main(args) == 0

    for name in GENERATED:
        assert (tmp_path / PACKAGE / name).read_text() == (REPO_ROOT / PACKAGE / name).read_text(), name


def test_the_service_is_the_kubelets() -> None:
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert {method.name for method in service.methods} == {"List", "Get", "GetAllocatableResources"}
