"""pyproject.toml as setuptools reads it for `make venv` and the images' `pip install`: without a deprecation
warning, which pip prints as a page of stars on every install."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

# Python 3.12's venvs come without setuptools; pip fetches it only into its isolated build environment.
pyprojecttoml = pytest.importorskip("setuptools.config.pyprojecttoml", reason="setuptools not installed")
dist = pytest.importorskip("setuptools.dist")

ROOT = Path(__file__).resolve().parents[2]


def test_setuptools_reads_pyproject_without_a_deprecation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # package discovery is relative to the project
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pyprojecttoml.apply_configuration(dist.Distribution(), ROOT / "pyproject.toml")
