"""Exact instruction counts of chosen parts of the work, from callgrind's client requests: a process run under
`valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no` (`run`) counts only inside a part
(`counting_part`: a function wrapped where it is looked up), one part per pass since toggles do not nest,
and dumps each pass under its label. Outside valgrind every request is a no-op."""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache, wraps
from pathlib import Path
from typing import Any, TypeVar

_SOURCE = b"""
#include <valgrind/callgrind.h>
void gtk_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void gtk_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void gtk_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
"""
T = TypeVar("T")


@cache
def _requests() -> ctypes.CDLL:
    """The client requests as a shared library, compiled once per source (needs cc and valgrind's headers)."""
    library = Path(tempfile.gettempdir()) / f"gtk-callgrind-{hashlib.sha256(_SOURCE).hexdigest()[:12]}.so"
    if not library.exists():
        source = library.with_suffix(".c")
        source.write_bytes(_SOURCE)
        subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return ctypes.CDLL(str(library))


def start() -> None:
    """Instrumentation on (setup before it runs at native speed); nothing is counted until `toggle`."""
    _requests().gtk_start()


def toggle() -> None:
    _requests().gtk_toggle()


def dump(label: str) -> None:
    """Writes what was counted since the last dump under `label`, and starts again from zero."""
    _requests().gtk_dump(label.encode())


class Calls:
    """How many times a counted part ran (what counting it cost grows with it)."""

    def __init__(self) -> None:
        self.count = 0


def counted_async(
    function: Callable[..., Awaitable[T]], calls: Calls | None = None
) -> Callable[..., Awaitable[T]]:
    """`function` (a coroutine function) counted from its call to its return; nothing else may run on the
    event loop meanwhile, or its instructions count too."""
    calls = calls or Calls()

    @wraps(function)
    async def counting(*args: Any, **kwargs: Any) -> T:
        calls.count += 1
        toggle()
        try:
            return await function(*args, **kwargs)
        finally:
            toggle()

    return counting


def counted(function: Callable[..., T], calls: Calls | None = None) -> Callable[..., T]:
    """`function` counted from its call to its return."""
    calls = calls or Calls()

    @wraps(function)
    def counting(*args: Any, **kwargs: Any) -> T:
        calls.count += 1
        toggle()
        try:
            return function(*args, **kwargs)
        finally:
            toggle()

    return counting


async def _nothing() -> None:
    return None


async def count_nothing(times: int) -> None:
    """What counting itself costs, `times` over (a coroutine function's and a plain one's), for
    `less_counting`."""
    empty, empty_sync = counted_async(_nothing), counted(lambda: None)
    for _ in range(times):
        await empty()
    dump(f"counting_itself_async@{times}")
    for _ in range(times):
        empty_sync()
    dump(f"counting_itself_sync@{times}")


@contextmanager
def counting_part(target: Any, name: str) -> Iterator[Calls]:
    """`target.name` counted from each call to its return, for the block; the calls it had."""
    value, calls = vars(target).get(name) or getattr(target, name), Calls()
    kind = counted_async if asyncio.iscoroutinefunction(value) else counted
    with patched(target, name, kind(value, calls)):
        yield calls


def dump_part(label: str, calls: Calls, coroutine: bool) -> None:
    """Dumps a part's count, its calls and its kind in the label (read back by `less_counting`)."""
    dump(f"{label}_{'async' if coroutine else 'sync'}@{calls.count}")


def less_counting(found: dict[str, int]) -> dict[str, int]:
    """Each dump's count (labelled `name_kind@calls` by `dump_part` and `count_nothing`) less what
    counting its calls cost, by its label's name."""
    parsed = {
        label.rpartition("@")[0]: (total, int(label.rpartition("@")[2])) for label, total in found.items()
    }
    cost = {
        kind: total / calls
        for kind in ("async", "sync")
        for total, calls in [parsed.pop(f"counting_itself_{kind}")]
    }
    return {
        label.rpartition("_")[0]: round(total - calls * cost[label.rpartition("_")[2]])
        for label, (total, calls) in parsed.items()
    }


@contextmanager
def patched(target: Any, name: str, value: Any) -> Iterator[None]:
    """`target.name` replaced by `value` for the block (a pass's wrapper of one part)."""
    held = vars(target)
    own, before = name in held, held.get(name)
    setattr(target, name, value)
    try:
        yield
    finally:
        if own:
            setattr(target, name, before)
        else:
            delattr(target, name)


def run(module: str, arguments: Sequence[str], cwd: Path) -> dict[str, int]:
    """Runs `python -m module arguments` under callgrind and answers each dump's label with its
    instruction count (the process calls `start`, then counts parts and `dump`s each pass)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    from bench.common import PYTHON

    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        subprocess.run(
            [
                "valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
                f"--callgrind-out-file={out}", PYTHON, "-m", module, *arguments,
            ],
            check=True, capture_output=True, cwd=cwd,
        )  # fmt: skip
        figures: dict[str, int] = {}
        for found in sorted(Path(scratch).glob("callgrind.out*")):
            text = found.read_text()
            label = re.search(r"^desc: Trigger: Client Request: (\S+)$", text, re.M)
            total = re.search(r"^totals: (\d+)", text, re.M) or re.search(r"^summary: (\d+)", text, re.M)
            if label and total:
                figures[label.group(1)] = int(total.group(1))
        return figures
