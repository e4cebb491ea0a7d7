"""CPU per admission, in-process through the ASGI app and (`--server`) in `python -m webhook`'s process beside
the bare baseline, one sequential keep-alive client each: CPU, not wall time, is the figure to compare
before and after a change on a shared machine. Needs no database and no API server."""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.admission import _review, _snapshot
from bench.common import PYTHON, asgi_caller, free_port, process
from bench.profile_ingest import _top
from webhook.certificates.tls import generate_ca, generate_serving_cert
from webhook.serving.app import create_app
from webhook.settings import WebhookSettings

KINDS = [(path, gpu) for path in ("/mutate", "/validate") for gpu in (True, False)]


def _label(path: str, gpu: bool) -> str:
    return f"{path[1:]} {'GPU' if gpu else 'non-GPU'} pod"


async def in_process(requests: int, rounds: int = 10) -> dict[str, float]:
    """Microseconds of this process's CPU per admission answered 200, through the ASGI app alone; kinds take
    turns in `rounds`, each kind's figure its least disturbed round (contention only ever adds)."""
    app = create_app(WebhookSettings(watch_priority_classes=False))
    app.state.cache.store(_snapshot(10_000), '"1"')
    calls = {_label(path, gpu): asgi_caller(app, path, _review(path, gpu)) for path, gpu in KINDS}
    for call in calls.values():
        for _ in range(max(100, requests // 10)):  # warm-up
            await call()
    per_round = max(1, requests // rounds)
    means: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(rounds):
        for label, call in calls.items():
            started = time.process_time()
            for _ in range(per_round):
                await call()
            means[label].append(1e6 * (time.process_time() - started) / per_round)
    return {label: min(values) for label, values in means.items()}


def _collect(requests: int) -> None:
    """Run inside callgrind (`instructions`): set up uninstrumented, then for each kind switch
    instrumentation on and send `requests` admissions inside `sorted()`, the function callgrind collects
    in, and dump the counts under the kind's label."""
    app = create_app(WebhookSettings(watch_priority_classes=False))
    app.state.cache.store(_snapshot(1_000), '"1"')
    loop = asyncio.new_event_loop()
    calls = {_label(path, gpu): asgi_caller(app, path, _review(path, gpu)) for path, gpu in KINDS}

    async def send(call: Callable[[], Awaitable[None]], count: int) -> None:
        for _ in range(count):
            await call()

    for call in calls.values():
        loop.run_until_complete(send(call, 20))  # warm-up: caches filled, code paths taken once
    control = ["callgrind_control"]
    subprocess.run([*control, "--instr=on", str(os.getpid())], check=True, capture_output=True)
    for label, call in calls.items():
        sorted([0], key=lambda _, call=call: loop.run_until_complete(send(call, requests)))  # type: ignore[misc]
        subprocess.run(
            [*control, f"--dump={label.replace(' ', '_')}", str(os.getpid())], check=True, capture_output=True
        )


def instructions(requests: int) -> dict[str, float]:
    """Instructions per admission through the ASGI app, counted by callgrind: exact and independent of
    whatever else runs on the machine (one run takes a minute or two)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        subprocess.run(
            [
                "valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
                "--toggle-collect=builtin_sorted", f"--callgrind-out-file={out}",
                PYTHON, "-m", "bench.admission_route", "--under-callgrind", "--requests", str(requests),
            ],
            check=True, capture_output=True, cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
        figures: dict[str, float] = {}
        for dump in sorted(Path(scratch).glob("callgrind.out.*")):
            text = dump.read_text()
            label = re.search(r"^desc: Trigger: .*dump (\S+)$", text, re.M)
            total = re.search(r"^totals: (\d+)", text, re.M)
            if label and total and int(total.group(1)):
                figures[label.group(1).replace("_", " ")] = int(total.group(1)) / requests
        return figures


def _cpu_seconds(pid: int) -> float:
    """A process's user + system CPU so far, from /proc (clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def _drive(port: int, path: str, body: bytes, requests: int, pid: int) -> float:
    """Server CPU µs per request over one keep-alive TLS connection, sent one after another."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context)
    headers = {"content-type": "application/json"}

    def one() -> None:
        connection.request("POST", path, body, headers)
        answer = connection.getresponse()
        answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{path}: status {answer.status}")

    for _ in range(max(100, requests // 10)):
        one()
    started = _cpu_seconds(pid)
    for _ in range(requests):
        one()
    used = _cpu_seconds(pid) - started
    connection.close()
    return 1e6 * used / requests


@contextmanager
def _servers() -> Iterator[tuple[tuple[int, int], tuple[int, int]]]:
    """`python -m webhook` and the bare ASGI baseline over TLS: ((port, pid), (port, pid))."""
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        ca_cert, ca_key = generate_ca("bench CA")
        cert, key = generate_serving_cert(ca_cert, ca_key, "webhook", "bench", extra_sans=("127.0.0.1",))
        (directory / "tls.crt").write_bytes(cert)
        (directory / "tls.key").write_bytes(key)
        env = {
            "WEBHOOK_TLS_CERT_FILE": str(directory / "tls.crt"),
            "WEBHOOK_TLS_KEY_FILE": str(directory / "tls.key"),
            "WEBHOOK_TIMEKEEPER_URL": "http://127.0.0.1:9",
            "WEBHOOK_LOG_FORMAT": "json",
            "WEBHOOK_WATCH_PRIORITY_CLASSES": "false",
        }
        webhook_port, bare_port = free_port(), free_port()
        webhook = [PYTHON, "-m", "webhook", "--host", "127.0.0.1", "--port", str(webhook_port)]
        bare = [
            PYTHON, "-m", "uvicorn", "bench.bare_asgi:app", "--host", "127.0.0.1", "--port", str(bare_port),
            "--ssl-certfile", env["WEBHOOK_TLS_CERT_FILE"], "--ssl-keyfile", env["WEBHOOK_TLS_KEY_FILE"],
            "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning",
        ]  # fmt: skip
        with (
            process(webhook, env=env, port=webhook_port) as served,
            process(bare, port=bare_port) as baseline,
        ):
            yield (webhook_port, served.pid), (bare_port, baseline.pid)


def server_side(requests: int, rounds: int = 5) -> dict[str, float]:
    """Server-process CPU µs per admission over TLS, and the bare ASGI baseline's (least disturbed
    round of `rounds`, the kinds taking turns)."""
    means: dict[str, list[float]] = {}
    with _servers() as ((webhook_port, webhook_pid), (bare_port, bare_pid)):
        targets = {
            _label(path, gpu): (webhook_port, webhook_pid, path, _review(path, gpu)) for path, gpu in KINDS
        }
        targets["bare ASGI"] = (bare_port, bare_pid, "/", _review("/mutate", True))
        for _ in range(rounds):
            for label, (port, pid, path, body) in targets.items():
                means.setdefault(label, []).append(_drive(port, path, body, requests // rounds, pid))
    return {label: min(values) for label, values in means.items()}


def profile(requests: int, top: int) -> None:
    """py-spy's view of the server while one client sends GPU-pod mutations: the frames with the most
    samples, inclusive and self (py-spy from the dev extra; it needs ptrace, which root has)."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not installed: pip install -e '.[dev]'")
    with tempfile.TemporaryDirectory() as scratch, _servers() as ((port, pid), _):
        collapsed = Path(scratch) / "webhook.txt"
        record = [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "500"]
        with subprocess.Popen(
            [*record, "--output", str(collapsed)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        ) as recorder:
            time.sleep(1.0)
            _drive(port, "/mutate", _review("/mutate", True), requests, pid)
            recorder.send_signal(signal.SIGINT)
            recorder.wait()
        total, inclusive, own = _top(collapsed, top)
    print(f"{total:,} samples of the server answering {requests:,} GPU-pod mutations")
    for title, rows in (("inclusive", inclusive), ("self", own)):
        print(f"\n## {title}")
        for frame, samples in rows:
            print(f"{100 * samples / total:5.1f} %  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--server", action="store_true", help="also measure the server process over TLS")
    parser.add_argument("--profile", action="store_true", help="only py-spy the server instead")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--callgrind", action="store_true", help="only count instructions per admission")
    parser.add_argument("--under-callgrind", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.under_callgrind:
        _collect(args.requests)
        return
    if args.callgrind:
        for label, count in instructions(args.requests).items():
            print(f"instructions per admission, {label}: {count:,.0f}")
        return
    if args.profile:
        profile(args.requests, args.top)
        return
    for label, micros in asyncio.run(in_process(args.requests)).items():
        print(f"ASGI app CPU per admission, {label}: {micros:.0f} µs")
    if args.server:
        for label, micros in server_side(args.requests).items():
            print(f"server CPU per request over TLS, {label}: {micros:.0f} µs")


if __name__ == "__main__":
    main()
