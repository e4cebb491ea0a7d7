"""hack/test-deps.sh, which `make test` runs first: where it cannot install the browser and Prometheus
layers' tools (not root), it prints the one command that does, so a newcomer can run every layer."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, tools: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """The script as a non-root user (a fake `id`) whose PATH holds only `tools` (empty stand-ins)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("bash", "dirname"):
        (bin_dir / name).symlink_to(shutil.which(name) or name)
    for name, body in {"id": "echo 1000", **dict.fromkeys(tools, "true")}.items():
        (bin_dir / name).write_text(f"#!{shutil.which('bash')}\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return subprocess.run(
        [str(bin_dir / "bash"), str(ROOT / "hack" / "test-deps.sh")],
        env={**os.environ, "PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_without_the_tools_it_says_the_one_command_that_installs_them(tmp_path: Path) -> None:
    assert "to run them: sudo hack/test-deps.sh" in _run(tmp_path, ()).stderr


def test_with_the_tools_it_says_nothing_about_them(tmp_path: Path) -> None:
    tools = ("promtool", "prometheus", "chromium", "chromedriver")
    assert "hack/test-deps.sh" not in _run(tmp_path, tools).stderr
