"""The slimmer ledger row (migration cb6919911663) changes no answer: the usage answers, efficiency, idle
pods and the chargeback export read from the ledger as it was before (the migration undone inside the
test's transaction) equal those read after it was done again."""

from __future__ import annotations

import importlib.util
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.support.processes import REPO_ROOT
from tests.support.timekeeper import Api, bearer, ok
from timekeeper.clock import ManualClock

pytestmark = pytest.mark.asyncio(loop_scope="session")

_spec = importlib.util.spec_from_file_location(
    "slim_ledger", REPO_ROOT / "migrations/versions/20261127_cb6919911663_slimmer_ledger_row.py"
)
assert _spec is not None and _spec.loader is not None
MIGRATION = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(MIGRATION)


def _run(connection: sa.Connection, step: str) -> None:
    with Operations.context(MigrationContext.configure(connection)):
        getattr(MIGRATION, step)()


async def answers(api: Api, window: dict[str, str]) -> dict[str, Any]:
    reader = bearer(api.tokens.reader)
    found: dict[str, Any] = {
        group_by: ok(await api.get("/namespaces/team-a/usage", group_by=group_by, **window))
        for group_by in ("pod", "workload", "hour", "day", "model")
    }
    found["efficiency"] = ok(
        await api.client.get("/namespaces/team-a/efficiency", params=window, headers=reader)
    )
    found["idle"] = ok(await api.client.get("/idle-pods", headers=reader))
    export = await api.client.get("/billing/chargeback", params={**window, "format": "csv"}, headers=reader)
    assert export.status_code == 200, export.text
    found["chargeback"] = export.text
    return found


async def test_every_answer_is_the_same_from_the_ledger_before_and_after(
    api: Api, clock: ManualClock, connection: AsyncConnection
) -> None:
    start = clock.now()
    clock.set(start + timedelta(minutes=80))
    shared = {"uuid": "GPU-s", "sm_util_pct": 85.0, "mem_used_bytes": 3000, "mem_total_bytes": 8000}
    pods: dict[str, list[dict[str, Any]]] = {  # a pod's GPU entries, as its sidecar reports each interval
        "idle": [{"uuid": "GPU-i", "sm_util_pct": 1.0, "mem_used_bytes": 10, "mem_total_bytes": 100}],
        "busy": [
            {**shared, "status": "ok", "name": "NVIDIA A100-SXM4-80GB", "energy_joules": 1500.5},
            {
                "uuid": "MIG-l",
                "sm_util_pct": None,
                "mem_used_bytes": None,
                "mem_total_bytes": None,
                "status": "lost",
                "parent_uuid": "GPU-p",
            },
        ],
        "tenant": [
            {**shared, "pod_sm_util_pct": 25.0, "pod_sm_util_max_pct": 40.0, "pod_mem_used_bytes": 1000}
        ],
        "blind": [],
    }
    for seq, minute in enumerate(range(0, 80, 10), start=1):
        for name, gpus in pods.items():
            ok(
                await api.report(
                    pod=name,
                    pod_uid=f"uid-{name}",
                    seq=seq,
                    start=start + timedelta(minutes=minute),
                    minutes=10,
                    gpu_share=0.5 if name == "tenant" else 1,
                    gpus=gpus,
                )
            )
    window = {"since": (start - timedelta(hours=1)).isoformat(), "until": clock.now().isoformat()}

    def ledger() -> Any:
        return connection.execute(sa.text("SELECT pod, seq, gpus FROM usage_ledger ORDER BY pod, seq"))

    after = await answers(api, window)
    rows = (await ledger()).all()
    await connection.run_sync(_run, "downgrade")
    before = await answers(api, window)
    old_rows = (await ledger()).all()
    await connection.run_sync(_run, "upgrade")

    assert after["idle"]["pods"] and after["chargeback"].count("\n") > 1  # the answers hold something
    assert {type(gpu) for row in old_rows for gpu in row.gpus} == {dict}  # the ledger as it was before
    assert {type(gpu) for row in rows for gpu in row.gpus} == {list}
    assert before == after
    assert await answers(api, window) == after
    assert (await ledger()).all() == rows
