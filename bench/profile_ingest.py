"""Where an ingest report's time goes: py-spy samples one timekeeper worker while wrk drives report load, and
the frames with the most samples are printed. py-spy is in the dev extra and needs ptrace (root has it)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.ingest import _reports, timekeeper


def _top(collapsed: Path, count: int) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        frames = stack.split(";")
        total += int(samples)
        own[frames[-1]] += int(samples)
        for frame in set(frames):
            inclusive[frame] += int(samples)
    return total, inclusive.most_common(count), own.most_common(count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not installed: pip install -e '.[dev]'")
    with tempfile.TemporaryDirectory() as scratch, timekeeper(workers=1) as server:
        collapsed = Path(scratch) / "ingest.txt"
        port = server.url.rsplit(":", 1)[1]
        pid = subprocess.run(
            ["pgrep", "-f", f"timekeeper --port {port}"], capture_output=True, text=True, check=True
        ).stdout.split()[0]
        record = [spy, "record", "--pid", pid, "--duration", str(args.seconds), "--format", "raw"]
        with subprocess.Popen(
            [*record, "--rate", "200", "--output", str(collapsed)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ) as recorder:
            time.sleep(0.5)
            load = _reports([server.url], server.token, args.seconds, args.connections)
            recorder.wait()
        total, inclusive, own = _top(collapsed, args.top)
    print(f"{load.requests:,} reports in {load.seconds:.1f} s ({load.rate:,.0f}/s), {total:,} samples")
    for title, rows in (("inclusive", inclusive), ("self", own)):
        print(f"\n## {title}")
        for frame, samples in rows:
            print(f"{100 * samples / total:5.1f} %  {frame}")


if __name__ == "__main__":
    main()
