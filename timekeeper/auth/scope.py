"""Which namespaces a listing shows a caller who may not read every namespace: a scoped credential's
own; anyone else refused the cluster-wide read sees the known namespaces it may read, each asked as a
single read would ask, so the list and the single reads never disagree (docs/kubernetes.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from timekeeper.auth.base import AccessControl, Action, Principal


async def readable_namespaces(
    access: AccessControl, principal: Principal, candidates: Sequence[str], concurrency: int
) -> frozenset[str]:
    """The candidates `principal` may read, asked by `concurrency` workers sharing them; the first error
    (a 503: the API server cannot review now) cancels the others and is raised as it is."""
    readable: set[str] = set()
    pending = iter(candidates)

    async def worker() -> None:
        for namespace in pending:  # shared: each namespace is taken by exactly one worker
            if await access.authorize(principal, Action.READ, namespace):
                readable.add(namespace)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(concurrency, len(candidates))):
                group.create_task(worker())
    except BaseExceptionGroup as errors:
        raise errors.exceptions[0] from None
    return frozenset(readable)
