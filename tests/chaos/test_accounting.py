"""The accounting chaos test: simulated pods with known usage report through the real stack while reports
are dropped, duplicated, delayed, reordered and re-sent under new numbers, the timekeeper is killed -9 and
restarted, and PostgreSQL crashes and recovers; at the end every namespace is charged exactly its pods'
ground truth and no pod's time is charged twice. The pods run across a UTC midnight, a boundary of the
ledger's day partitions.

Ground truth: each pod runs for INTERVALS contiguous intervals of INTERVAL at its fixed share, so it is
charged share x INTERVALS x INTERVAL (tests/chaos/simulation.py, the parts this test shares with the
fleet's, tests/cluster/test_fleet_chaos.py).

Billing weights: each pod's GPU has a model (one unnamed, counting 1), weighted as set before the run, one
weight changing mid-run; the charged (weighted) minutes must equal share x each second at its weight.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.chaos.simulation import (
    Pod,
    Run,
    TimekeeperProcess,
    assert_chaos_happened,
    chaos,
    migrated_throwaway,
)
from tests.support.partitions import partition_days_from
from tests.support.processes import free_port
from tests.support.throwaway_postgres import ThrowawayPostgres
from tests.support.timekeeper import Tokens, bearer, ok
from timekeeper.domain.weights import model_key

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

INTERVAL = timedelta(seconds=10)
INTERVALS = 60
SHARES = (Decimal("0.125"), Decimal("0.5"), Decimal("1"), Decimal("2.5"))
# The GPU model each share's pods run on (NVML's name; None: the sidecar could not tell), by share index.
MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "Tesla T4", None)
# (model, weight, from which interval of the run on): A100's weight changes a third of the way in.
WEIGHTS = (
    ("NVIDIA-H100-80GB-HBM3", Decimal(3), -INTERVALS),
    ("NVIDIA-A100-SXM4-40GB", Decimal(2), -INTERVALS),
    ("NVIDIA-A100-SXM4-40GB", Decimal("1.25"), INTERVALS // 3),
    ("Tesla-T4", Decimal("0.5"), -INTERVALS),
)
NAMESPACES = ("chaos-a", "chaos-b", "chaos-c")


def weighted_truth(pod: Pod) -> Decimal:
    """What the budget is charged: each interval's minutes at the weight its model had then."""
    seconds = Decimal(int(INTERVAL.total_seconds()))
    return sum((pod.share * seconds * weight_at(pod.model, i) / 60 for i in range(INTERVALS)), Decimal(0))


def weight_at(model: str | None, interval: int) -> Decimal:
    key = None if model is None else model.replace(" ", "-")
    weight = Decimal(1)
    for weighted, value, since in WEIGHTS:
        if weighted == key and since <= interval:
            weight = value
    return weight


def _boundary(now: datetime) -> datetime:
    """The latest UTC midnight a whole run before now (the run ends at least a run's length ago)."""
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight if now - midnight >= INTERVALS * INTERVAL else midnight - timedelta(days=1)


def _pods(run: Run, headers: dict[str, str]) -> list[Pod]:
    return [
        Pod(namespace, f"worker-{s}", f"uid-{n}-{s}", share, run, headers, MODELS[s])
        for n, namespace in enumerate(NAMESPACES)
        for s, share in enumerate(SHARES)
    ]


@pytest.fixture
def postgres() -> Iterator[ThrowawayPostgres]:
    with migrated_throwaway() as server:
        yield server


async def test_charges_equal_ground_truth_through_drops_duplicates_and_restarts(
    postgres: ThrowawayPostgres, tmp_path: Path
) -> None:
    tokens = Tokens()
    settings = tokens.settings()
    env = {
        "TIMEKEEPER_DATABASE_URL": postgres.url,
        "TIMEKEEPER_ADMIN_TOKEN_SHA256": settings["admin_token_sha256"],
        "TIMEKEEPER_REPORTER_TOKEN_SHA256": settings["reporter_token_sha256"],
        # Every raw row kept (the run may lie up to a day back): the checks below read them beside the
        # hourly aggregates.
        "TIMEKEEPER_LEDGER_RETENTION": str(3 * 24 * 3600),
    }
    timekeeper = TimekeeperProcess(free_port(), env, tmp_path / "timekeeper.log")
    # Intervals in the past (so none is refused as future) across the last UTC midnight but one run ago,
    # each of them in the partition of the day of its end.
    midnight = _boundary(datetime.now(UTC))
    start = midnight - INTERVALS // 2 * INTERVAL
    pods = _pods(Run(start, INTERVAL, INTERVALS), bearer(tokens.reporter))
    with psycopg.connect(postgres.url.replace("+psycopg", "")) as db:
        partition_days_from(db, midnight, 1)
        for model, weight, since in WEIGHTS:  # set before the pods ran, as an admin would have
            db.execute(
                "INSERT INTO gpu_weights (model, effective_from, weight, set_by) "
                "VALUES (%s, %s, %s, 'chaos')",
                (model, start + since * INTERVAL, weight),
            )
    await timekeeper.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{timekeeper.port}", timeout=10) as client:
            # One namespace on a small daily budget: its running totals are kept per day (split at midnight
            # UTC when the run spans one) and its state and the snapshot version change mid-run.
            ok(
                await client.put(
                    "/api/v1/namespaces/chaos-a/budget",
                    # And a small H100 budget of its own, exhausted in today's part of the run.
                    json={
                        "budget_gpu_minutes": 10,
                        "period": "daily",
                        "models": {"NVIDIA-H100-80GB-HBM3": {"budget_gpu_minutes": 0.25}},
                    },
                    headers=bearer(tokens.admin),
                )
            )
            tally = await chaos(pods, client, timekeeper, postgres, seed=20261122)
            until = start + INTERVALS * INTERVAL
            usage = {
                namespace: ok(
                    await client.get(
                        f"/api/v1/namespaces/{namespace}/usage",
                        params={"since": start.isoformat(), "until": until.isoformat()},
                        headers=bearer(tokens.admin),
                    )
                )
                for namespace in NAMESPACES
            }
            charged = {ns: Decimal(str(answer["total_gpu_minutes"])) for ns, answer in usage.items()}
            raw = {ns: Decimal(str(answer["total_raw_gpu_minutes"])) for ns, answer in usage.items()}
    finally:
        await timekeeper.kill()

    raw_truth = {ns: sum((p.truth for p in pods if p.namespace == ns), Decimal(0)) for ns in NAMESPACES}
    truth = {ns: sum((weighted_truth(p) for p in pods if p.namespace == ns), Decimal(0)) for ns in NAMESPACES}
    assert_chaos_happened(tally)
    for namespace in NAMESPACES:
        assert abs(charged[namespace] - truth[namespace]) <= Decimal("1e-6"), (namespace, charged, truth)
        assert abs(charged[namespace] - truth[namespace]) <= truth[namespace] / 1000
        assert abs(raw[namespace] - raw_truth[namespace]) <= Decimal("1e-6"), (namespace, raw, raw_truth)

    with psycopg.connect(postgres.url.replace("+psycopg", "")) as db:
        ledger = dict(
            db.execute("SELECT namespace, sum(gpu_minutes) FROM usage_ledger GROUP BY namespace").fetchall()
        )
        totals = dict(
            db.execute(
                "SELECT namespace, sum(used_gpu_minutes) FROM usage_totals "
                "WHERE period_kind = 'daily' OR namespace <> 'chaos-a' GROUP BY namespace"
            ).fetchall()
        )
        overlaps = db.execute(
            "SELECT count(*) FROM usage_ledger a JOIN usage_ledger b "
            "ON a.pod_uid = b.pod_uid AND a.id < b.id AND a.charged && b.charged"
        ).fetchone()
        charged_seconds = dict(
            db.execute(
                "SELECT l.pod_uid, sum(extract(epoch FROM upper(r) - lower(r))) "
                "FROM usage_ledger l CROSS JOIN LATERAL unnest(l.charged) AS r GROUP BY l.pod_uid"
            ).fetchall()
        )
        stored = set(db.execute("SELECT pod_uid, seq FROM usage_ledger").fetchall())
        # The history the answers read (pod-hours and any pod-days folded from them): each pod's pieces,
        # summed one by one, are its run, once.
        hour_seconds = dict(
            db.execute(
                "SELECT c.pod_uid, sum(extract(epoch FROM upper(r) - lower(r))) "
                "FROM usage_history('-infinity', NULL) h "
                "JOIN pod_coverage c ON c.id = h.pod_key CROSS JOIN LATERAL unnest(h.charged) AS r "
                "GROUP BY c.pod_uid"
            ).fetchall()
        )
        # The per-model totals (raw GPU-minutes, '' for a pod whose model is not known), maintained by
        # each charge: exactly each model's truth, through the same chaos.
        by_model = {
            (namespace, model): used
            for namespace, model, used in db.execute(
                "SELECT namespace, model, sum(used_gpu_minutes) FROM usage_model_totals "
                "WHERE period_kind = 'daily' OR namespace <> 'chaos-a' GROUP BY 1, 2"
            ).fetchall()
        }
        model_states = db.execute(
            "SELECT model_states FROM namespace_status WHERE namespace = 'chaos-a'"
        ).fetchone()
        partitions = db.execute(
            "SELECT CAST(tableoid AS regclass)::text, count(*) FROM usage_ledger GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert [name for name, _ in partitions] == ["usage_ledger_before", f"usage_ledger_p{midnight:%Y%m%d}"]
    for namespace in NAMESPACES:
        assert abs(ledger[namespace] - truth[namespace]) <= Decimal("1e-6"), (ledger, truth)
        assert abs(totals[namespace] - truth[namespace]) <= Decimal("1e-6"), (totals, truth)
    model_truth: dict[tuple[str, str], Decimal] = {}
    for pod in pods:
        key = (pod.namespace, "" if pod.model is None else model_key(pod.model))
        model_truth[key] = model_truth.get(key, Decimal(0)) + pod.truth
    assert by_model.keys() == model_truth.keys()
    for key, expected in model_truth.items():
        assert abs(by_model[key] - expected) <= Decimal("1e-6"), (key, by_model, model_truth)
    assert model_states == ({"NVIDIA-H100-80GB-HBM3": "exhausted"},)
    assert overlaps == (0,), "a pod's time was charged twice"
    for pod in pods:
        assert charged_seconds[pod.uid] == INTERVALS * int(INTERVAL.total_seconds()), pod
        assert hour_seconds[pod.uid] == INTERVALS * int(INTERVAL.total_seconds()), pod
        # Acknowledged means committed: every acknowledged report survived the kills and the crashes.
        assert {(pod.uid, seq) for seq in pod.acknowledged} <= stored, pod
