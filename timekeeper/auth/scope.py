"""Which namespaces a listing shows a caller who may not read every namespace.

A scoped credential (static mode's scoped reader and reporter tokens) names its namespaces itself.
Anyone else who is refused the cluster-wide read (Kubernetes mode: a namespace member, who has `get
gpubudgets` in some namespaces but not `list` at cluster scope) is shown the known namespaces (those `GET
/namespaces` lists for a cluster-wide reader: `namespace_status`) that the access control lets them read,
each asked as
`authorize(principal, READ, namespace)` would be for that namespace's own budget, so the list and the
single reads can never disagree.

Cost (docs/kubernetes.md, "Listing for namespace members"): one question per known namespace, at most
`concurrency` in flight; the access control's decision cache (Kubernetes mode: SubjectAccessReview
answers, 10 s, keyed by user, groups, verb and namespace) makes a repeat within that time free of reviews.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from timekeeper.auth.base import AccessControl, Action, Principal


async def readable_namespaces(
    access: AccessControl, principal: Principal, candidates: Sequence[str], concurrency: int
) -> frozenset[str]:
    """The candidates `principal` may read. `concurrency` workers share the candidates: a cached answer
    costs no await on I/O, so a repeat listing is a loop, and a first one keeps at most `concurrency`
    reviews in flight (a per-namespace task would cost a task each even when cached). The first error (a
    503: the API server cannot review now) cancels the other workers and is raised as it is."""
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
