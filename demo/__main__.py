"""`python -m demo [--serve] [--plain]`: run the local demo (what `make demo` calls)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType

import httpx
from rich.console import Console

from demo.cluster import DemoError, LocalCluster, Ports, free_port
from demo.story import Story, working_folder_note
from demo.view import Board, LiveView, PlainView, View

WEBHOOK_POLL_INTERVAL_SECONDS = 0.5
PLAIN_WIDTH = 120


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m demo",
        description="GPU Timekeeper on one machine: the timekeeper on an embedded PostgreSQL, the webhook "
        "over HTTPS and simulated GPU pods whose sidecars report through a fake NVML.",
    )
    parser.add_argument("--serve", action="store_true", help="keep everything running after the story")
    parser.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    parser.add_argument("--timekeeper-port", type=int, default=0, help="default: a free port")
    parser.add_argument("--webhook-port", type=int, default=0, help="default: a free port")
    return parser.parse_args(argv)


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    """SIGTERM stops the demo like Ctrl-C, through the same cleanup."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # Logs are read in wide windows; rich's 80-column fallback would wrap the tables.
        console = Console(width=PLAIN_WIDTH)
    if importlib.util.find_spec("sidecar") is None:
        console.print("The sidecar package is not installed here; `make demo` sets it up.")
        return 1
    signal.signal(signal.SIGTERM, _interrupt)
    workdir = Path(tempfile.mkdtemp(prefix="gtk-demo-"))
    ports = Ports(args.timekeeper_port or free_port(), args.webhook_port or free_port())
    cluster = LocalCluster(workdir, ports, WEBHOOK_POLL_INTERVAL_SECONDS)
    board = Board()
    view: View = (
        PlainView(console)
        if args.plain or not console.is_terminal
        else LiveView(console, "GPU Timekeeper demo")
    )
    story: Story | None = None
    try:
        view.event(board, working_folder_note(workdir))
        cluster.start(lambda step: view.event(board, f"starting {step}"))
        board.clock = cluster.clock
        story = Story(cluster, view, board)
        story.run(args.serve)
        return 0
    except KeyboardInterrupt:
        return 0
    except (DemoError, httpx.HTTPError) as error:
        view.close()
        console.print(f"demo failed: {error}", markup=False, highlight=False)
        return 1
    finally:
        # The cleanup is bounded by its own timeouts; a second Ctrl-C must not cut it short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        view.close()
        if story is not None:
            story.close()
        cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)
        console.print("stopped the sidecars, the webhook, the timekeeper and PostgreSQL", markup=False)


if __name__ == "__main__":
    sys.exit(main())
