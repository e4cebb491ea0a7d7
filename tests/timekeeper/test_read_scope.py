"""How a listing narrows to the namespaces a caller may read one by one (timekeeper/auth/scope.py): every
known namespace asked exactly once, never more questions in flight than the bound. The questions go to an
access control written here that answers after a pause and records how many were open at once; what a
real one decides is tests/kube/test_listing.py (stand-in API server) and tests/cluster/test_access.py."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from timekeeper.auth.base import Action, Principal
from timekeeper.auth.scope import readable_namespaces
from timekeeper.errors import TimekeeperError


class SlowRbac:
    """Allows `allowed`; each answer takes a moment, as a SubjectAccessReview does."""

    def __init__(self, allowed: set[str], failing: str | None = None) -> None:
        self.allowed = allowed
        self.failing = failing
        self.asked: Counter[str] = Counter()
        self.open = 0
        self.most_open = 0

    async def authenticate(self, token: str, cluster: str | None) -> Principal | None:
        return None

    async def authorize(self, principal: Principal, action: Action, namespace: str | None) -> bool:
        assert action is Action.READ and namespace is not None
        self.asked[namespace] += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            await asyncio.sleep(0.001)
            if namespace == self.failing:
                raise TimekeeperError("the Kubernetes API cannot review credentials now; retry later", 503)
            return namespace in self.allowed
        finally:
            self.open -= 1

    async def aclose(self) -> None:
        pass


KNOWN = [f"team-{number:02}" for number in range(40)]


@pytest.mark.parametrize("concurrency", [1, 4, 64])
async def test_each_namespace_is_asked_once_with_at_most_the_bound_in_flight(concurrency: int) -> None:
    rbac = SlowRbac({"team-03", "team-17", "elsewhere"})

    readable = await readable_namespaces(rbac, Principal(name="alice"), KNOWN, concurrency)

    assert readable == {"team-03", "team-17"}
    assert rbac.asked == Counter(KNOWN)
    assert rbac.most_open == min(concurrency, len(KNOWN))


async def test_no_known_namespace_asks_nothing() -> None:
    rbac = SlowRbac({"team-a"})
    assert await readable_namespaces(rbac, Principal(name="alice"), [], 8) == frozenset()
    assert not rbac.asked


async def test_a_failed_question_fails_the_listing_with_its_own_error() -> None:
    """Not an ExceptionGroup (a 500) and not a partial list: the 503 a single read would get."""
    rbac = SlowRbac(set(KNOWN), failing="team-20")

    with pytest.raises(TimekeeperError) as failed:
        await readable_namespaces(rbac, Principal(name="alice"), KNOWN, 4)

    assert failed.value.status_code == 503
    assert rbac.open == 0  # the other workers were cancelled, none left asking
