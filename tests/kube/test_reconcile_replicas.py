"""The reconcile job in real processes against the stand-in API server: two `python -m timekeeper` replicas,
one reconciles; the leader is SIGKILLed and the survivor takes the pass over, charging a silent pod's time
exactly once. And `python -m timekeeper.scheduler` runs the pass too."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from tests.kube.factories import gpu_pod
from tests.kube.test_reconcile import iso
from tests.support.kube_apiserver import KubeApiServer
from tests.support.postgres import url_string
from tests.support.replicas import (
    Replica,
    scheduler_process,
    scheduler_status,
    started_replicas,
    wait_for_leader,
)
from tests.support.timekeeper import Tokens, migrated_database

pytestmark = pytest.mark.e2e

SHARE = Decimal("0.5")


@pytest.fixture
def database() -> Iterator[URL]:
    with migrated_database("gtk_reconcile_replicas") as url:
        yield url


@pytest.fixture
def reconcile_env(kubeconfig: Path) -> dict[str, str]:
    return {
        **Tokens().env(),
        "TIMEKEEPER_RECONCILE": "true",
        "TIMEKEEPER_KUBE_IN_CLUSTER": "false",
        "TIMEKEEPER_KUBECONFIG": str(kubeconfig),
        "TIMEKEEPER_RECONCILE_INTERVAL_SECONDS": "0.3",
        "TIMEKEEPER_SILENT_GRACE_SECONDS": "0",  # every pass charges up to its own now
        "TIMEKEEPER_LEADER_RETRY_INTERVAL": "0.3",
        # A slow check on a loaded machine would hand leadership over before the kill; a killed leader's
        # session ends at once, whatever this timeout (docs/scheduler.md).
        "TIMEKEEPER_LEADER_CHECK_TIMEOUT": "10",
        "TIMEKEEPER_SCHEDULER_LOCK_KEY": "4244",
    }


def silent_pod(apiserver: KubeApiServer) -> tuple[str, datetime]:
    """A running GPU pod whose sidecar never reports: the passes charge all of its time."""
    started = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    pod = gpu_pod(apiserver, "team-a", "silent", share=str(SHARE), started_at=iso(started))
    return pod["metadata"]["uid"], started


def charged_once(database: URL, uid: str, started: datetime) -> Decimal:
    """Checks that the pod's charged time is one stretch from its start with no second on it charged
    twice (the ledger rows' time adds up to the coverage's), and that the namespace's total is the
    ledger's; answers that total."""
    engine = sa.create_engine(url_string(database), poolclass=sa.NullPool)
    with engine.connect() as connection:
        [covered] = connection.execute(
            sa.text("SELECT r FROM pod_coverage, unnest(covered) AS r WHERE pod_uid = :uid"), {"uid": uid}
        ).scalars()
        charged_time = connection.execute(
            sa.text(
                "SELECT sum(upper(r) - lower(r)) FROM usage_ledger, unnest(charged) AS r WHERE pod_uid = :uid"
            ),
            {"uid": uid},
        ).scalar_one()
        ledger = connection.execute(
            sa.text("SELECT sum(gpu_minutes) FROM usage_ledger WHERE pod_uid = :uid"), {"uid": uid}
        ).scalar_one()
        total = connection.execute(
            sa.text("SELECT sum(used_gpu_minutes) FROM usage_totals WHERE namespace = 'team-a'")
        ).scalar_one()
    engine.dispose()
    assert covered.lower == started
    assert charged_time == covered.upper - covered.lower
    assert total == ledger > 0
    return ledger


def reconcile_runs(database: URL) -> list[tuple[str, datetime]]:
    engine = sa.create_engine(url_string(database), poolclass=sa.NullPool)
    with engine.connect() as connection:
        runs = connection.execute(
            sa.text("SELECT replica, ran_at FROM job_runs WHERE job = 'reconcile' ORDER BY ran_at")
        ).all()
    engine.dispose()
    return [(run.replica, run.ran_at) for run in runs]


@pytest.mark.asyncio(loop_scope="session")
async def test_one_replica_reconciles_and_the_survivor_takes_over_charging_once(
    apiserver: KubeApiServer, database: URL, reconcile_env: dict[str, str], tmp_path: Path
) -> None:
    uid, started = silent_pod(apiserver)
    with started_replicas(database, reconcile_env, tmp_path) as replicas:
        async with httpx.AsyncClient(timeout=5) as client:
            leader = await wait_for_leader(client, replicas)
            [survivor] = [replica for replica in replicas if replica is not leader]

            async def reconciled(replica: Replica) -> None:
                deadline = time.monotonic() + 20
                while True:
                    status = await scheduler_status(client, replica)
                    if status is not None and status["jobs"]["reconcile"]["last_success"] is not None:
                        return
                    assert time.monotonic() < deadline, f"{replica.name} never reconciled"
                    await asyncio.sleep(0.1)

            await reconciled(leader)
            follower = await scheduler_status(client, survivor)
            assert follower is not None and follower["leader"] is False
            assert follower["jobs"]["reconcile"]["last_run"] is None

            leader.kill()
            killed_at = datetime.now(UTC)
            assert await wait_for_leader(client, [survivor]) is survivor
            await reconciled(survivor)
            await asyncio.sleep(1)  # a few more passes

    ledger = charged_once(database, uid, started)
    assert ledger >= SHARE * 10  # at least the ten minutes before the first pass
    runs = reconcile_runs(database)
    assert {replica for replica, _ in runs} == {leader.name, survivor.name}
    assert max(at for replica, at in runs if replica == leader.name) <= killed_at
    assert min(at for replica, at in runs if replica == survivor.name) >= killed_at


def test_the_scheduler_process_runs_the_reconcile_pass(
    apiserver: KubeApiServer, database: URL, reconcile_env: dict[str, str], tmp_path: Path
) -> None:
    uid, started = silent_pod(apiserver)
    with scheduler_process(database, reconcile_env, tmp_path / "scheduler.log") as scheduler:
        scheduler.wait_for_metric(
            'timekeeper_job_last_success_timestamp_seconds{job="reconcile"}',
            "the scheduler process to run the reconcile pass",
        )
    assert charged_once(database, uid, started) >= SHARE * 10
    assert {replica for replica, _ in reconcile_runs(database)} == {scheduler.replica}
