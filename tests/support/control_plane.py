"""A real Kubernetes control plane for the cluster layer (tests/cluster): kube-apiserver 1.20 + etcd +
kube-controller-manager on loopback, started by a control-plane script with the interface of the team's
../shared/kube/control-plane.sh (`up` prints shell exports, `down` stops what `up` started).

Where it comes from, first match wins (docs/kubernetes.md, "The cluster layer"):

1. `TIMEKEEPER_TEST_KUBE_CONTROL_PLANE`: a control-plane script;
2. `../shared/kube/control-plane.sh` beside the repository (CI clones main with shared/ beside it), or
   beside its main checkout when this is a `git worktree`;
3. the repository's own `hack/kube-control-plane.sh`, when its binaries are built (`make kube-binaries`).

`TIMEKEEPER_TEST_KUBE_BIN_DIR` (default `.pytest-kube/bin`) holds prebuilt `kube-apiserver` and
`kube-controller-manager`; they are linked into each run's folder so no run unpacks or builds them again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import REPO_ROOT

SCRIPT_ENV = "TIMEKEEPER_TEST_KUBE_CONTROL_PLANE"
BIN_DIR_ENV = "TIMEKEEPER_TEST_KUBE_BIN_DIR"
REQUIRED_ENV = "TIMEKEEPER_TEST_REQUIRE_CLUSTER"
SHARED_SCRIPT = Path("shared") / "kube" / "control-plane.sh"  # relative to the checkout's parent
OWN_SCRIPT = REPO_ROOT / "hack" / "kube-control-plane.sh"
DEFAULT_BIN_DIR = REPO_ROOT / ".pytest-kube" / "bin"
BINARIES = ("kube-apiserver", "kube-controller-manager")
UP_TIMEOUT_SECONDS = 300  # a fresh machine apt-installs etcd first


class Unavailable(Exception):
    """No control plane can start here; the message is the one line the skipped layer reports."""


def required() -> bool:
    """CI sets this: a control plane that cannot start is then a failure, not a skip."""
    return os.environ.get(REQUIRED_ENV, "").lower() in ("1", "true", "yes")


def bin_dir() -> Path:
    return Path(os.environ.get(BIN_DIR_ENV) or DEFAULT_BIN_DIR)


def _has_binaries(folder: Path) -> bool:
    return all(os.access(folder / name, os.X_OK) for name in BINARIES)


def locate_script() -> Path:
    """The control-plane script to run, by the order in the module docstring."""
    if configured := os.environ.get(SCRIPT_ENV):
        script = Path(configured)
        if not script.is_file():
            raise Unavailable(f"{SCRIPT_ENV}={configured} is not a file")
        return script
    for checkout in (REPO_ROOT, _main_checkout()):
        if (checkout.parent / SHARED_SCRIPT).is_file():
            return checkout.parent / SHARED_SCRIPT
    if _has_binaries(bin_dir()):
        return OWN_SCRIPT
    raise Unavailable(
        f"no Kubernetes control plane: set {SCRIPT_ENV} (or {BIN_DIR_ENV}), put shared/ beside the "
        "repository, or run `make kube-binaries`"
    )


def _main_checkout() -> Path:
    """The checkout whose .git a worktree shares (the repository itself when it is not a worktree)."""
    done = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--path-format=absolute", "--git-common-dir"],
        capture_output=True,
        text=True,
        check=False,
    )
    return Path(done.stdout.strip()).parent if done.returncode == 0 else REPO_ROOT


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


@dataclass(frozen=True)
class ControlPlane:
    """A running control plane: what `up` exported, and how to stop it."""

    script: Path
    directory: Path
    kubeconfig: Path
    server: str
    ca: Path
    ca_key: Path
    admin_token: str

    @classmethod
    def up(cls, directory: Path) -> ControlPlane:
        """Start one in `directory` (its own state, PKI and free ports); Unavailable when it cannot."""
        script = locate_script()
        binaries = bin_dir()
        if _has_binaries(binaries):
            (directory / "bin").mkdir(parents=True, exist_ok=True)
            for name in BINARIES:
                link = directory / "bin" / name
                if not link.exists():
                    link.symlink_to(binaries / name)
        env = {**os.environ, "KUBE_CP_DIR": str(directory)}
        try:
            done = subprocess.run(
                ["bash", str(script), "up"],
                env=env,
                capture_output=True,
                text=True,
                timeout=UP_TIMEOUT_SECONDS,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            cls._down(script, directory)
            raise Unavailable(f"{script} up took more than {UP_TIMEOUT_SECONDS}s") from error
        if done.returncode != 0:
            cls._down(script, directory)
            raise Unavailable(f"{script} up failed: {_last_line(done.stderr or done.stdout)}")
        exported = dict(
            line.removeprefix("export ").split("=", 1)
            for line in done.stdout.splitlines()
            if line.startswith("export ")
        )
        cls._cache_binaries(directory / "bin", binaries)
        return cls(
            script=script,
            directory=directory,
            kubeconfig=Path(exported["KUBECONFIG"]),
            server=exported["KUBE_CP_SERVER"],
            ca=Path(exported["KUBE_CP_CA"]),
            ca_key=Path(exported["KUBE_CP_CA_KEY"]),
            admin_token=exported["KUBE_CP_ADMIN_TOKEN"],
        )

    @staticmethod
    def _cache_binaries(built: Path, cache: Path) -> None:
        """Keep the binaries this run unpacked or built for the next (in the default, git-ignored cache)."""
        if cache != DEFAULT_BIN_DIR or _has_binaries(cache) or not _has_binaries(built):
            return
        cache.mkdir(parents=True, exist_ok=True)
        for name in BINARIES:
            partial = cache / f"{name}.partial"
            shutil.copy2(built / name, partial)
            partial.replace(cache / name)

    @staticmethod
    def _down(script: Path, directory: Path) -> None:
        subprocess.run(
            ["bash", str(script), "down"],
            env={**os.environ, "KUBE_CP_DIR": str(directory)},
            capture_output=True,
            timeout=60,
            check=False,
        )

    def down(self) -> None:
        self._down(self.script, self.directory)

    def logs(self) -> str:
        """The tail of the API server's log, for a failing test's message."""
        log = self.directory / "logs" / "kube-apiserver.log"
        return log.read_text()[-3000:] if log.exists() else ""


class Background:
    """A control plane brought up, and later down, in a thread of its own, so that its start and stop
    (mostly waiting on etcd and the API server) overlap the tests that run meanwhile."""

    def __init__(self, directory: Path) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kube-control-plane")
        self._up: Future[ControlPlane] = self._thread.submit(ControlPlane.up, directory)
        self._down: Future[None] | None = None

    def plane(self) -> ControlPlane:
        """The running control plane, once `up` is done; Unavailable when it could not start."""
        return self._up.result()

    def stop(self) -> None:
        """Starts `down` (after `up`) without waiting for it."""
        if self._down is None:
            self._down = self._thread.submit(self._stop)

    def _stop(self) -> None:
        if self._up.exception() is None:
            self._up.result().down()

    def wait_stopped(self) -> None:
        self.stop()
        self._thread.shutdown(wait=True)
