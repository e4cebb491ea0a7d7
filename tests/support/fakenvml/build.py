"""Compile the fake NVML library with the machine's C compiler, against nvidia-nvml-dev's nvml.h.

The library carries the soname `libnvidia-ml.so.1`, so it can stand in for the driver's copy both on
LD_LIBRARY_PATH and when loaded by path first (SIDECAR_NVML_LIBRARY).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("fakenvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"


def find_compiler() -> str | None:
    """The C compiler to use: $CC's usual suspects on PATH, or None when the machine has none."""
    for candidate in ("cc", "gcc", "clang"):
        found = shutil.which(candidate)
        if found:
            return found
    return None


def find_nvml_header() -> Path | None:
    """nvml.h from the `nvidia-nvml-dev` wheel (installed under the `nvidia` namespace package)."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        for header in sorted(Path(location).glob("*/include/nvml.h"), reverse=True):
            return header
    return None


def build(output_dir: Path, compiler: str, header: Path, *, old_driver: bool = False) -> Path:
    """Compile into `output_dir`; warnings are errors, so a signature that drifts from nvml.h fails.

    NVML_NO_UNVERSIONED_FUNC_DEFS makes nvml.h declare the older entry points (the _v2 process list) so
    they are signature-checked too; `old_driver` leaves out the _v3 process list, as drivers before 510."""
    output_dir.mkdir(parents=True, exist_ok=True)
    library = output_dir / LIBRARY_NAME
    subprocess.run(
        [
            compiler,
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{header.parent}",
            "-DNVML_NO_UNVERSIONED_FUNC_DEFS",
            *(["-DFAKE_NVML_OLD_DRIVER"] if old_driver else []),
            f"-Wl,-soname,{LIBRARY_NAME}",
            "-o",
            str(library),
            str(SOURCE),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return library
