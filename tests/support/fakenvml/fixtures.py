"""The pytest fixture that builds the fake libnvidia-ml.so.1 once per run (sidecar and node agent tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fakenvml.build import build, find_compiler, find_nvml_header


@pytest.fixture(scope="session")
def fake_nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake libnvidia-ml.so.1, compiled once per run against nvidia-nvml-dev's nvml.h."""
    compiler = find_compiler()
    if compiler is None:
        pytest.skip("no C compiler (cc, gcc or clang) on PATH: cannot build the fake libnvidia-ml.so.1")
    header = find_nvml_header()
    if header is None:
        pytest.skip("nvml.h not found: install the dev extra (nvidia-nvml-dev)")
    return build(tmp_path_factory.mktemp("fakenvml"), compiler, header)
