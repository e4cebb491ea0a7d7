"""One source of truth per budget: while a GPUBudget (or the GPUBudgetDefault) governs a budget, the REST
API refuses to change it, with a 409 naming the object; other namespaces, reads and grants are unaffected.
(The claim is what the sync writes when it sees an object: tests/cluster/test_gitops.py drives it.)"""

from __future__ import annotations

import pytest
from fastapi import FastAPI

from tests.support.timekeeper import Api, ok
from tests.timekeeper.conftest import START
from timekeeper.app import current
from timekeeper.budgets.managed.repository import ManagedRepository, ObjectRef

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def claim(app: FastAPI, ref: ObjectRef) -> None:
    async with current(app).sessions() as session, session.begin():
        await ManagedRepository(session).claim(ref, START)


async def release(app: FastAPI, key: str) -> None:
    async with current(app).sessions() as session, session.begin():
        await ManagedRepository(session).release(key)


async def test_a_governed_namespace_refuses_rest_writes_naming_the_object(api: Api, app: FastAPI) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=100))
    await claim(app, ObjectRef("GPUBudget", "team-a", "budget", "uid-1", 1))

    put = await api.put_budget("team-a", budget_gpu_minutes=5)
    delete = await api.delete_budget("team-a")
    for answer in (put, delete):
        assert answer.status_code == 409, answer.text
        assert answer.json()["detail"] == (
            "namespace team-a's budget is managed by GPUBudget team-a/budget (gpu-timekeeper.io): "
            "change or delete that object instead"
        )
    assert (await api.budget("team-a"))["budget_gpu_minutes"] == 100
    ok(await api.grant("team-a", 10))  # a one-off top-up is not policy
    ok(await api.put_budget("team-b", budget_gpu_minutes=5))  # another namespace is the API's
    ok(await api.put_defaults(budget_gpu_minutes=None))

    await release(app, "team-a")
    ok(await api.put_budget("team-a", budget_gpu_minutes=5))


async def test_the_default_object_refuses_put_defaults(api: Api, app: FastAPI) -> None:
    await claim(app, ObjectRef("GPUBudgetDefault", None, "default", "uid-2", 1))
    answer = await api.put_defaults(budget_gpu_minutes=1000)
    assert answer.status_code == 409
    assert "the default budget is managed by GPUBudgetDefault default" in answer.json()["detail"]
    ok(await api.put_budget("team-a", budget_gpu_minutes=5))  # namespaces are not the default's object


async def test_an_unauthenticated_caller_learns_nothing_of_the_object(api: Api, app: FastAPI) -> None:
    await claim(app, ObjectRef("GPUBudget", "team-a", "budget", "uid-1", 1))
    answer = await api.put_budget("team-a", token="not-a-token", budget_gpu_minutes=5)
    assert answer.status_code == 401
