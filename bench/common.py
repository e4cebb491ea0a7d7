"""What every benchmark shares: the machine's description, percentiles, results and the report file."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.support.processes import (
    free_port as free_port,
)  # re-exported: the one helper, shared with the tests

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_FILE = REPO_ROOT / "bench" / "RESULTS.md"


@dataclass
class Figure:
    """One measured figure, with the target it is held to and the same-run baseline it is compared with."""

    name: str
    value: float
    unit: str
    target: str = ""
    baseline: float | None = None
    baseline_name: str = ""
    note: str = ""

    @property
    def ratio(self) -> str:
        if not self.baseline:
            return ""
        return f"{self.value / self.baseline:.2f}x of {self.baseline:,.1f} {self.unit} ({self.baseline_name})"


@dataclass
class Section:
    title: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def progress(message: str) -> None:
    """One line on stderr as each step begins, so a long `make bench` is never silent."""
    one, _, _ = os.getloadavg()
    print(f"[bench {datetime.now(UTC):%H:%M:%S} load {one:.1f}] {message}", file=sys.stderr, flush=True)


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile; fraction in [0, 1]."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[rank]


def machine_description() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} cores ({cpu}), {memory_gib:.0f} GiB, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def write_results(sections: Sequence[Section], path: Path = RESULTS_FILE) -> None:
    """Rewrite RESULTS.md with this run's figures; the file is the benchmarks' written record."""
    lines = [
        "# Benchmark results",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M UTC} by `make bench` on: {machine_description()}.",
        "Every figure runs against real processes and a real PostgreSQL on this one machine; the baseline",
        "beside it was measured in the same run on the same machine.",
        "",
    ]
    for section in sections:
        lines += [f"## {section.title}", ""]
        if section.figures:
            lines += ["| figure | value | target | vs. baseline |", "|---|---|---|---|"]
        for figure in section.figures:
            lines.append(
                f"| {figure.name} | {figure.value:,.2f} {figure.unit} | {figure.target} | {figure.ratio} |"
            )
        if section.figures:
            lines.append("")
        lines += [f"- {note}" for note in section.notes]
        if section.notes:
            lines.append("")
    lines += _sections_kept(path, {section.title for section in sections})
    path.write_text("\n".join(lines))


def _sections_kept(path: Path, written: set[str]) -> list[str]:
    """The file's sections this run does not write (`make bench-history`'s, the profiles measured by hand)."""
    if not path.exists():
        return []
    parts = path.read_text().split("\n## ")[1:]
    return [f"## {part.rstrip()}\n" for part in parts if part.split("\n", 1)[0] not in written]


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


@contextmanager
def process(
    args: Sequence[str], env: dict[str, str] | None = None, port: int | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a child process for the duration of a benchmark, waiting for its port when given."""
    child = subprocess.Popen(
        list(args),
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        if port is not None:
            try:
                wait_for_port(port)
            except TimeoutError:
                child.kill()
                raise RuntimeError(f"{args} did not start: {child.stderr.read().decode()[-2000:]}") from None
        yield child
    finally:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()


PYTHON = sys.executable


def asgi_caller(
    app: Any, path: str, body: bytes, headers: Sequence[tuple[bytes, bytes]] = (), method: str = "POST"
) -> Callable[[], Awaitable[int]]:
    """One request through the whole ASGI app, with the cheapest possible receive/send; any status but
    200 raises. The call answers the size of the response body."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "https",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ],
        "server": ("127.0.0.1", 8443),
        "client": ("127.0.0.1", 50000),
    }
    message = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict[str, Any]:
        return message

    sent = [0]

    async def send(reply: dict[str, Any]) -> None:
        if reply["type"] == "http.response.start" and reply["status"] != 200:
            raise RuntimeError(f"status {reply['status']}")
        if reply["type"] == "http.response.body":
            sent[0] += len(reply.get("body", b""))

    async def call() -> int:
        sent[0] = 0
        await app(dict(scope), receive, send)
        return sent[0]

    return call
