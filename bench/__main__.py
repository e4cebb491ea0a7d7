"""`make bench`: every benchmark section, one after the other so they never compete for the cores, into
bench/RESULTS.md with the machine's load average before and after; the timekeeper's on a private
PostgreSQL configured like production (bench.common.POSTGRES_SETTINGS, written beside the figures)."""

from __future__ import annotations

import argparse
import os

from bench import admission, hostile, ingest, ranges, sidecar_bench
from bench.common import RESULTS_FILE, Section, progress, write_results


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10, help="length of each load run (default 10)")
    parser.add_argument("--connections", type=int, default=64, help="concurrent report clients (default 64)")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn workers per timekeeper (default 1)")
    parser.add_argument("--replicas", type=int, default=2, help="timekeeper processes (default 2)")
    parser.add_argument(
        "--sidecar-seconds", type=float, default=60.0, help="sidecar measurement window (default 60)"
    )
    args = parser.parse_args()
    before = _load()
    sections = ingest.run(args.seconds, args.connections, args.workers, args.replicas)
    progress("webhook admissions")
    sections.append(admission.run(args.seconds))
    progress("webhook under hostile input")
    sections.append(hostile.run())
    progress("both servers under issue #27's hostile clients")
    sections.append(hostile.run_issue_27())
    progress("requests sized before they are expanded (issue #38)")
    sections.append(ranges.run())
    progress("both servers under issue #38's hostile clients from many addresses")
    sections.append(hostile.run_issue_38())
    progress(f"sidecar footprint, {args.sidecar_seconds:g}s")
    sections.append(sidecar_bench.run(args.sidecar_seconds))
    sections.append(
        Section(
            "Conditions",
            notes=[
                f"load average (1 / 5 / 15 min) before: {before}; after: {_load()}",
                "how these figures are measured and what each ratio means: docs/performance.md",
            ],
        )
    )
    write_results(sections)
    print(RESULTS_FILE.read_text())


if __name__ == "__main__":
    main()
