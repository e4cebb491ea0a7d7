"""The accounting chaos test: simulated pods with known usage report through the real stack while reports
are dropped, duplicated, delayed, reordered and re-sent under new numbers, the timekeeper is killed -9 and
restarted, and PostgreSQL crashes and recovers; at the end every namespace is charged exactly its pods'
ground truth and no pod's time is charged twice. The pods run across a UTC midnight, a boundary of the
ledger's day partitions.

Ground truth: each pod runs for INTERVALS contiguous intervals of INTERVAL at its fixed share and, like
the sidecar, retries every report until it is acknowledged, so it is charged share x INTERVALS x INTERVAL.
Re-sends under new sequence numbers (a sidecar that lost its numbering) span time already reported;
they may charge what has not been charged yet, never anything twice, so the union of a pod's intervals
is still the whole run.

Billing weights: each pod's GPU has a model (one unnamed, counting 1), weighted as set before the run, one
weight changing mid-run; the charged (weighted) minutes must equal share x each second at its weight.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url

from tests.support.partitions import partition_days_from
from tests.support.postgres import REPO_ROOT
from tests.support.throwaway_postgres import ThrowawayPostgres, throwaway_postgres
from tests.support.timekeeper import Tokens, bearer, migrate, ok, report_body
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
# Fractions of the pods' acknowledged reports at which each disruption strikes, in this order.
DISRUPTIONS = (0.15, 0.35, 0.55, 0.75)


@dataclass
class Pod:
    namespace: str
    name: str
    uid: str
    share: Decimal
    start: datetime
    model: str | None
    pending: list[tuple[int, int, int]] = field(default_factory=list)  # (seq, first, last interval)
    acknowledged: set[int] = field(default_factory=set)

    @property
    def truth(self) -> Decimal:
        """GPU-minutes: the share over the union of the intervals it reports (the whole run)."""
        return self.share * Decimal(INTERVALS * int(INTERVAL.total_seconds())) / 60

    @property
    def weighted_truth(self) -> Decimal:
        """What the budget is charged: each interval's minutes at the weight its model had then."""
        seconds = Decimal(int(INTERVAL.total_seconds()))
        return sum(
            (self.share * seconds * weight_at(self.model, i) / 60 for i in range(INTERVALS)), Decimal(0)
        )

    def body(self, seq: int, first: int, last: int) -> dict[str, object]:
        return report_body(
            namespace=self.namespace,
            pod=self.name,
            pod_uid=self.uid,
            seq=seq,
            start=self.start + first * INTERVAL,
            end=self.start + (last + 1) * INTERVAL,
            gpu_share=float(self.share),
            gpus=[
                {"uuid": "GPU-0", "sm_util_pct": 50.0, "mem_used_bytes": 1, "mem_total_bytes": 2}
                | ({"name": self.model} if self.model else {})
            ],
        )


def weight_at(model: str | None, interval: int) -> Decimal:
    key = None if model is None else model.replace(" ", "-")
    weight = Decimal(1)
    for weighted, value, since in WEIGHTS:
        if weighted == key and since <= interval:
            weight = value
    return weight


@dataclass
class Tally:
    """What happened, so the test can show the chaos really took place."""

    acknowledged: int = 0
    duplicates: int = 0
    failures: int = 0
    dropped: int = 0
    disruptions: list[str] = field(default_factory=list)
    progress: asyncio.Condition = field(default_factory=asyncio.Condition)


class TimekeeperProcess:
    """`python -m timekeeper` on a fixed port, killed with SIGKILL and started again at will."""

    def __init__(self, port: int, env: dict[str, str], log: Path) -> None:
        self.port = port
        self.env = {**os.environ, **env}
        self.log = log
        self.child: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        args = ["-m", "timekeeper", "--port", str(self.port), "--log-level", "warning"]
        with self.log.open("ab") as log:
            self.child = await asyncio.create_subprocess_exec(
                sys.executable, *args, cwd=REPO_ROOT, env=self.env, stdout=log, stderr=log
            )
        for _ in range(600):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                assert self.child.returncode is None, f"timekeeper exited: {self.log.read_text()[-2000:]}"
                await asyncio.sleep(0.05)
        raise TimeoutError("timekeeper did not start listening")

    async def kill(self) -> None:
        if self.child is not None and self.child.returncode is None:
            self.child.kill()
            await self.child.wait()


def _boundary(now: datetime) -> datetime:
    """The latest UTC midnight a whole run before now (the run ends at least a run's length ago)."""
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight if now - midnight >= INTERVALS * INTERVAL else midnight - timedelta(days=1)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _pods(start: datetime) -> list[Pod]:
    pods = []
    for n, namespace in enumerate(NAMESPACES):
        for s, share in enumerate(SHARES):
            name = f"worker-{s}"
            pod = Pod(namespace, name, f"uid-{n}-{s}", share, start, MODELS[s])
            pod.pending = [(seq, seq, seq) for seq in range(INTERVALS)]
            pods.append(pod)
    return pods


async def _send(client: httpx.AsyncClient, token: str, body: dict[str, object], tally: Tally) -> bool:
    """One attempt: True when acknowledged. A refused connection or a 5xx is an outage to retry
    through; any other answer is a bug in the timekeeper."""
    try:
        response = await client.post("/api/v1/reports", json=body, headers=bearer(token))
    except httpx.TransportError:
        tally.failures += 1
        return False
    if response.status_code >= 500:
        tally.failures += 1
        return False
    ack = ok(response)
    tally.duplicates += ack["duplicate"]
    return True


async def _report(pod: Pod, client: httpx.AsyncClient, token: str, rng: random.Random, tally: Tally) -> None:
    """The pod's sidecar under a hostile network: picks any pending report (reordering), waits a while
    (delay), sometimes never sends it (dropped, retried later) or sends it twice at once (duplicated);
    after an acknowledgement it sometimes re-sends time already reported under a new sequence number."""
    next_seq = 1000
    while pod.pending:
        seq, first, last = rng.choice(pod.pending)
        await asyncio.sleep(rng.uniform(0, 0.1))
        roll = rng.random()
        if roll < 0.15:
            tally.dropped += 1
            continue
        copies = 2 if roll > 0.85 else 1
        body = pod.body(seq, first, last)
        results = await asyncio.gather(*(_send(client, token, body, tally) for _ in range(copies)))
        if not any(results):
            await asyncio.sleep(rng.uniform(0.05, 0.2))
            continue
        pod.pending.remove((seq, first, last))
        pod.acknowledged.add(seq)
        if seq < 1000:
            tally.acknowledged += 1
            async with tally.progress:
                tally.progress.notify_all()
        if rng.random() < 0.1:
            span_first = rng.randrange(INTERVALS)
            span_last = min(INTERVALS - 1, span_first + rng.randrange(3))
            pod.pending.append((next_seq, span_first, span_last))
            next_seq += 1


async def _disrupt(
    tally: Tally, total: int, timekeeper: TimekeeperProcess, postgres: ThrowawayPostgres
) -> None:
    async def kill_timekeeper() -> None:
        await timekeeper.kill()
        await asyncio.sleep(0.3)
        await timekeeper.start()

    async def restart_postgres() -> None:
        await asyncio.to_thread(postgres.restart)

    async def both() -> None:
        await timekeeper.kill()
        await restart_postgres()
        await timekeeper.start()

    steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("timekeeper killed -9 and restarted", kill_timekeeper),
        ("PostgreSQL crashed (immediate) and restarted", restart_postgres),
        ("timekeeper killed, PostgreSQL crashed, both restarted", both),
        ("PostgreSQL crashed (immediate) and restarted", restart_postgres),
    ]
    for fraction, (name, step) in zip(DISRUPTIONS, steps, strict=True):
        async with tally.progress:
            await tally.progress.wait_for(lambda fraction=fraction: tally.acknowledged >= fraction * total)
        await step()
        tally.disruptions.append(f"{name} at {tally.acknowledged}/{total}")


@pytest.fixture
def postgres() -> Iterator[ThrowawayPostgres]:
    with throwaway_postgres() as server:
        migrate(make_url(server.url))
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
    timekeeper = TimekeeperProcess(_free_port(), env, tmp_path / "timekeeper.log")
    # Intervals in the past (so none is refused as future) across the last UTC midnight but one run ago,
    # each of them in the partition of the day of its end.
    midnight = _boundary(datetime.now(UTC))
    start = midnight - INTERVALS // 2 * INTERVAL
    pods = _pods(start)
    tally = Tally()
    rng = random.Random(20261122)
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
            total = len(pods) * INTERVALS
            await asyncio.gather(
                *(_report(pod, client, tokens.reporter, random.Random(rng.random()), tally) for pod in pods),
                _disrupt(tally, total, timekeeper, postgres),
            )
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
    truth = {ns: sum((p.weighted_truth for p in pods if p.namespace == ns), Decimal(0)) for ns in NAMESPACES}
    assert len(tally.disruptions) == len(DISRUPTIONS), tally
    assert tally.dropped and tally.duplicates and tally.failures, tally
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
