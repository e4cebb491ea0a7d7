"""The read path: budget reads and the admission snapshot write nothing and run without a transaction
around them; the compact snapshot gives every namespace exactly the entry its budget status names."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from psycopg._connection_base import BaseConnection
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from gpuaccounting.admission_state import resolve
from tests.support.timekeeper import Api, bearer, ok
from timekeeper.app import create_app
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

STRICT = {"exempt_classes": ["system-node-critical"], "user_classes": "replace", "ceiling": None}
CEILING = {"exempt_classes": [], "user_classes": "keep_up_to_ceiling", "ceiling": 500}
READS = ["/namespaces", "/namespaces/team-a/budget", "/namespaces/never-seen/budget", "/admission-state"]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_snapshot_gives_every_namespace_the_entry_its_budget_status_names(
    api: Api, seed: int
) -> None:
    rng = random.Random(seed)
    ok(
        await api.put_defaults(
            budget_gpu_minutes=rng.choice([None, 0, 100]),
            max_gpu_share_per_pod=rng.choice([None, 1]),
            priority_policy=rng.choice([None, CEILING]),
        )
    )
    namespaces = [f"team-{i}" for i in range(12)]
    for namespace in namespaces:
        ok(
            await api.put_budget(
                namespace,
                budget_gpu_minutes=rng.choice([None, 0, 10, 100]),
                max_gpu_share_per_pod=rng.choice([None, 0.5, 2]),
                priority_policy=rng.choice([None, STRICT, CEILING]),
            )
        )
        if rng.random() < 0.3:
            ok(await api.grant(namespace, rng.choice([1, 50])))
        if rng.random() < 0.3:  # known, back on the default
            ok(await api.delete_budget(namespace))

    snapshot = ok(await api.get("/admission-state"))
    default, listed = resolve(snapshot)

    for namespace in [*namespaces, "never-seen"]:
        status = ok(await api.get(f"/namespaces/{namespace}/budget"))
        expected = {
            "state": status["state"],
            "max_gpu_share_per_pod": status["max_gpu_share_per_pod"],
            "priority_policy": status["priority_policy"],
            "exhausted_models": sorted(m for m, f in status["models"].items() if f["state"] == "exhausted"),
            "model_policy": status["model_policy"],
        }
        assert listed.get(namespace, default) == expected, namespace
        assert (namespace in listed) == (expected != default)
    policies = snapshot["priority_policies"]
    assert len(policies) == len({repr(policy) for policy in policies})


async def test_reads_write_nothing(api: Api, app: FastAPI, connection: AsyncConnection) -> None:
    ok(await api.put_budget("team-a", budget_gpu_minutes=0))
    etag = (await api.get("/admission-state")).headers["etag"]
    await connection.execute(text("SAVEPOINT read_only"))
    await connection.execute(text("SET LOCAL transaction_read_only = on"))

    answers = [(await api.get(path)).status_code for path in READS]
    unchanged = await api.client.get(
        "/admission-state", headers={"If-None-Match": etag, **bearer(api.tokens.reader)}
    )
    # The guard is real: a write now fails.
    with pytest.raises(Exception, match="read-only transaction"):
        await connection.execute(
            text("INSERT INTO namespace_status (namespace, state) VALUES ('x', 'in_budget')")
        )
    await connection.execute(text("ROLLBACK TO SAVEPOINT read_only"))

    assert answers == [200, 200, 200, 200]
    assert unchanged.status_code == 304


@contextmanager
def transaction_commands() -> Iterator[list[bytes]]:
    """The transaction commands (BEGIN, COMMIT, ROLLBACK) psycopg sends meanwhile."""
    sent: list[bytes] = []
    command = BaseConnection._exec_command

    def recorded(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(bytes(query) if isinstance(query, bytes) else str(query).encode())
        return command(self, query, *args, **kwargs)

    BaseConnection._exec_command = recorded  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        BaseConnection._exec_command = command  # type: ignore[method-assign]


async def test_reads_send_no_begin_or_commit(settings: Settings, api: Api) -> None:
    """With the app's own engine (not the test's transaction): a read is its statements alone."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://timekeeper/api/v1") as client:
            reader = bearer(api.tokens.reader)
            for path in READS:  # warm the pool: a new connection asks the server a few things once
                ok(await client.get(path, headers=reader))
            with transaction_commands() as sent:
                for path in READS:
                    ok(await client.get(path, headers=reader))

    assert sent == []


async def test_a_read_with_a_bad_namespace_is_told_which_parameter(api: Api) -> None:
    response = await api.client.get("/namespaces/Team_A/budget", headers=bearer(api.tokens.reader))

    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert (error["loc"], error["type"]) == (["path", "namespace"], "string_pattern_mismatch")


async def test_a_read_without_a_token_is_401_whatever_its_path(api: Api) -> None:
    for path in [*READS, "/namespaces/Team_A/budget"]:
        response = await api.client.get(path)
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"] == "Bearer"


async def test_the_budget_read_is_the_listed_one_and_its_path_is_exact(api: Api) -> None:
    """GET /namespaces/{ns}/budget answers what the listing shows; other methods are 405, paths that are
    not exactly the route's 404, a body above the limit 413."""
    ok(await api.put_budget("team-a", budget_gpu_minutes=100))
    reader = bearer(api.tokens.reader)
    listed = {entry["namespace"]: entry for entry in ok(await api.get("/namespaces"))}

    assert ok(await api.client.get("/namespaces/team-a/budget", headers=reader)) == listed["team-a"]
    assert (await api.client.post("/namespaces/team-a/budget", headers=reader)).status_code == 405
    assert (await api.client.get("/namespaces/a/b/budget", headers=reader)).status_code == 404
    assert (await api.client.get("/namespaces//budget", headers=reader)).status_code == 404
    too_large = {**reader, "content-length": str(10**9)}
    assert (await api.client.get("/namespaces/team-a/budget", headers=too_large)).status_code == 413
