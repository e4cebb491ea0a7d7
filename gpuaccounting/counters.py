"""Counters whose known label sets exist from the start: a series born at its first event has no earlier
sample, so `rate()` and `increase()` miss that first burst (an error counter would alert one event late)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Protocol


class Labelled(Protocol):
    """A prometheus_client metric with labels (typed here, so this module imports no client)."""

    def labels(self, **labels: str) -> object: ...


def start_at_zero(counter: Labelled, **values: Iterable[str]) -> None:
    """Create every combination of the given label values, each at 0."""
    names = list(values)
    for combination in itertools.product(*values.values()):
        counter.labels(**dict(zip(names, combination, strict=True)))
