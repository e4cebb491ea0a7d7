"""Drive HTTP load with wrk (C, event-driven), so the load generator is not what limits the figures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent


@dataclass(frozen=True)
class WrkResult:
    requests: int
    seconds: float
    errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    client_cpu_seconds: float  # wrk's own user + system time: how busy the load generator was

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    @property
    def client_cpu_pct(self) -> float:
        """wrk's CPU as a percentage of one core over the run; far below 100 % on its one thread means
        it was waiting for the server, not the other way round."""
        return 100 * self.client_cpu_seconds / self.seconds


def require_wrk() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise SystemExit("wrk is not installed: `apt-get install wrk` (make bench does it when run as root)")
    return path


def run_wrk(
    url: str,
    script: str,
    script_args: list[str],
    *,
    seconds: int,
    connections: int,
    threads: int = 1,
    rate: int | None = None,
) -> WrkResult:
    """Run wrk against url; `rate` is not supported by plain wrk, so it is left to the caller's design."""
    del rate
    command = [
        require_wrk(),
        f"--threads={threads}",
        f"--connections={connections}",
        f"--duration={seconds}s",
        "--timeout=10s",
        f"--script={SCRIPTS / script}",
        url,
        "--",
        *script_args,
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as child:
        assert child.stdout is not None
        output = child.stdout.read()
        # Reaped here with wait4: this very child's CPU time, even while other wrk processes run alongside.
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"wrk failed ({child.returncode}): {output[-2000:]}")
    line = next(line for line in output.splitlines() if line.startswith("WRK_RESULT "))
    raw = json.loads(line.removeprefix("WRK_RESULT "))
    errors = sum(
        raw[key] for key in ("status_errors", "connect_errors", "read_errors", "write_errors", "timeouts")
    )
    return WrkResult(
        requests=raw["requests"],
        seconds=raw["duration_us"] / 1e6,
        errors=errors,
        p50_ms=raw["p50_us"] / 1000,
        p90_ms=raw["p90_us"] / 1000,
        p99_ms=raw["p99_us"] / 1000,
        max_ms=raw["max_us"] / 1000,
        client_cpu_seconds=usage.ru_utime + usage.ru_stime,
    )


def combine(results: list[WrkResult]) -> WrkResult:
    """Concurrent runs against several servers as one: requests and CPU add up over the longest run;
    percentiles are the worst of the runs (an upper bound: wrk reports no histograms to merge)."""
    return WrkResult(
        requests=sum(result.requests for result in results),
        seconds=max(result.seconds for result in results),
        errors=sum(result.errors for result in results),
        p50_ms=max(result.p50_ms for result in results),
        p90_ms=max(result.p90_ms for result in results),
        p99_ms=max(result.p99_ms for result in results),
        max_ms=max(result.max_ms for result in results),
        client_cpu_seconds=sum(result.client_cpu_seconds for result in results),
    )


def one_after_another(results: list[WrkResult]) -> WrkResult:
    """Runs of the same load made one after another (rounds) as one: requests, time and CPU add up, so the
    rate is the rounds' mean (equal lengths); percentiles are the worst round's."""
    return WrkResult(
        requests=sum(result.requests for result in results),
        seconds=sum(result.seconds for result in results),
        errors=sum(result.errors for result in results),
        p50_ms=max(result.p50_ms for result in results),
        p90_ms=max(result.p90_ms for result in results),
        p99_ms=max(result.p99_ms for result in results),
        max_ms=max(result.max_ms for result in results),
        client_cpu_seconds=sum(result.client_cpu_seconds for result in results),
    )
