"""The accounting chaos test in a fleet (issue #42, docs/fleet.md): the hub's own cluster is the cluster
layer's API server (`cluster_a`), and member `b` is a second one (`cluster_b`, with deployment/member
applied and its webhook running). Real pods, in namespaces of the same names in both, report with their
own pod-bound tokens (b's naming their cluster) through the hostile network of tests/chaos/simulation.py
while the hub is killed -9 and restarted and its PostgreSQL crashes. Every report states a share that is a
lie, and a pod named alike in both clusters holds another share in each: each is charged at the share its
own cluster's API server says. At the end every namespace key
(`chaos-x` of the hub's cluster, `b/chaos-x` of b's) is charged exactly its pods' ground truth, as each
cluster's admin reads it, in the ledger and in the running totals; and the chargeback export, per cluster
and in all, agrees with those figures to the rounding rule of docs/billing.md.

One API server is configured once: a's as the hub's own cluster (no member `a`), b's as member `b`.

The run is recent: it starts once every pod exists (the latest creation time, whole seconds) and lasts
RUN_INTERVALS x RUN_INTERVAL, short enough that its last interval ends within the hub's clock-skew
allowance of now, so no report is of time before its pod existed or in the future beyond the allowance.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from gpuaccounting.names import CLUSTER_HEADER
from tests.chaos.simulation import (
    Pod,
    Run,
    TimekeeperProcess,
    assert_chaos_happened,
    chaos,
    migrated_throwaway,
    truth_by,
)
from tests.cluster.conftest import start_webhook
from tests.cluster.harness import gpu_probe, placed, sidecar_token
from tests.cluster.test_fleet import (  # noqa: F401 (cluster_a, cluster_b, member_install: fixtures)
    Member,
    MemberInstall,
    cluster_a,
    cluster_b,
    member_install,
    namespace_in,
)
from tests.support.processes import free_port
from tests.support.throwaway_postgres import ThrowawayPostgres
from tests.support.timekeeper import bearer, ok
from timekeeper.domain.clusters import namespace_key, pod_key, split_key

# ruff: noqa: F811 (the fixtures imported from test_fleet are this module's parameters)

pytestmark = pytest.mark.timeout(1500)  # two API servers, the member install and the run, on a busy machine

MEMBER = "b"
NAMESPACES = ("chaos-x", "chaos-y")  # in both clusters: keys `chaos-x` and `b/chaos-x` share a bare name
# Each pod's GPU requests (limits) and the share they come to (gpuaccounting.shares): HAMi's memory and
# core fractions of one GPU, one whole GPU, and 2.5 GPUs. b's pods take them in the other order, so a pod
# named alike in both clusters holds another share in each.
SHARED_GPUS = (
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240"}, Decimal("0.125")),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50"}, Decimal("0.5")),
    ({"nvidia.com/gpu": "1"}, Decimal("1")),
    ({"nvidia.com/gpu": "5", "nvidia.com/gpucores": "50"}, Decimal("2.5")),
)
# What every pod's reports state as their share: a lie, as a tenant may tell it; each is charged the share
# its own cluster's API server says it was admitted at.
STATED_SHARE = Decimal("0.01")
RUN_INTERVAL = timedelta(seconds=1)
RUN_INTERVALS = 50  # the run ends 50 s after it starts: inside the hub's 60 s clock-skew allowance
POOL = "fleet-chaos"
NANO = Decimal("0.000000001")
EXACT = Decimal("1e-6")  # the chaos test's exactness: each report's charge is rounded once to NANO


@pytest.fixture
def postgres() -> Iterator[ThrowawayPostgres]:
    with migrated_throwaway() as server:
        yield server


def shared_gpu_pod(member: Member, namespace: str, name: str, limits: dict[str, str]) -> dict[str, Any]:
    """A pod with these GPU limits, created through whatever admits pods in the member (no kubelet: it
    stays Pending, which the hub's read of its share does not mind)."""
    body = placed(gpu_probe(namespace), namespace, name)
    body["spec"]["containers"][0]["resources"] = {"limits": limits}
    return member.kubectl.create(body)


def pods_in(member: Member, cluster: str | None) -> list[tuple[dict[str, Any], Decimal, dict[str, str]]]:
    """Every namespace's pods in `member` (cluster None: the hub's own), each with its share and the
    headers its sidecar reports with: its own pod-bound token, and its cluster where it is a member."""
    named = {} if cluster is None else {CLUSTER_HEADER: cluster}
    gpus = SHARED_GPUS if cluster is None else tuple(reversed(SHARED_GPUS))
    created = []
    for namespace in NAMESPACES:
        namespace_in(member, namespace)
        for n, (limits, share) in enumerate(gpus):
            pod = shared_gpu_pod(member, namespace, f"worker-{n}", limits)
            created.append((pod, share, bearer(sidecar_token(member.core, pod)) | named))
    return created


def key_of(pod: Pod) -> str:
    """The namespace key a simulated pod is charged under: its namespace in the cluster it names."""
    return namespace_key(pod.headers.get(CLUSTER_HEADER), pod.namespace)


def stored_uid(pod: Pod) -> str:
    """The pod key a simulated pod's charged time is kept under (a member's uid qualified by its cluster)."""
    return pod_key(pod.headers.get(CLUSTER_HEADER), pod.uid)


def usage(client: httpx.Client, key: str, run: Run, admin: Member) -> tuple[Decimal, Decimal]:
    """(charged, raw) GPU-minutes of a namespace key over the run, read as its cluster's admin."""
    cluster, namespace = split_key(key)
    headers = bearer(admin.admin_token) | ({} if cluster is None else {CLUSTER_HEADER: cluster})
    params = {"since": run.start.isoformat(), "until": run.end.isoformat()}
    answer = ok(client.get(f"/api/v1/namespaces/{namespace}/usage", params=params, headers=headers))
    assert (answer["cluster"], answer["namespace"]) == (cluster, namespace)
    return Decimal(str(answer["total_gpu_minutes"])), Decimal(str(answer["total_raw_gpu_minutes"]))


def chargeback(client: httpx.Client, run: Run, admin: Member, cluster: str | None = None) -> Any:
    """The JSON chargeback export over the run (daily periods), as the hub's own admin; `cluster` keeps
    one cluster's rows ("" the hub's own)."""
    params = {"since": run.start.isoformat(), "until": run.end.isoformat(), "period": "daily"}
    if cluster is not None:
        params["cluster"] = cluster
    return ok(client.get("/api/v1/billing/chargeback", params=params, headers=bearer(admin.admin_token)))


def minutes(figure: object) -> Decimal:
    """A JSON amount (a number, rounded to NANO where it was made) as the exact decimal it stands for."""
    return Decimal(str(figure)).quantize(NANO)


async def test_a_fleets_charges_and_export_equal_ground_truth_through_chaos(
    cluster_a: Member,
    cluster_b: Member,
    member_install: MemberInstall,
    postgres: ThrowawayPostgres,
    tmp_path: Path,
) -> None:
    env = {
        "TIMEKEEPER_DATABASE_URL": postgres.url,
        "TIMEKEEPER_AUTH_MODE": "kubernetes",
        "TIMEKEEPER_KUBE_IN_CLUSTER": "false",
        "TIMEKEEPER_KUBECONFIG": str(cluster_a.plane.kubeconfig),
        "TIMEKEEPER_MEMBERS": json.dumps({MEMBER: {"kubeconfig": str(member_install.hub_kubeconfig)}}),
        "TIMEKEEPER_LOG_FORMAT": "json",
    }
    hub = TimekeeperProcess(free_port(), env, tmp_path / "hub.log")
    (tmp_path / "webhook-b").mkdir()
    await hub.start()
    # b's webhook (the member install's configurations point at it) admits b's GPU pods, polling the hub.
    webhook_b = start_webhook(
        cluster_b.plane,
        cluster_b.core,
        member_install.tls,
        hub,  # start_webhook reads its url only
        tmp_path / "webhook-b",
        member_install.webhook_port,
        WEBHOOK_CLUSTER=MEMBER,
        WEBHOOK_STATE_POLL_INTERVAL_SECONDS="1",
    )
    try:
        created = pods_in(cluster_a, None) + pods_in(cluster_b, MEMBER)
        latest = max(datetime.fromisoformat(pod["metadata"]["creationTimestamp"]) for pod, *_ in created)
        run = Run(latest, RUN_INTERVAL, RUN_INTERVALS)
        pods = []
        for pod, share, headers in created:
            meta = pod["metadata"]
            pods.append(
                Pod(meta["namespace"], meta["name"], meta["uid"], share, run, headers, None, STATED_SHARE)
            )
        async with httpx.AsyncClient(base_url=hub.url, timeout=10) as client:
            pool = {
                "budget_gpu_minutes": 10**6,
                "members": [{"namespace": "chaos-x"}, {"namespace": "b/chaos-x"}],
            }
            ok(await client.put(f"/api/v1/pools/{POOL}", json=pool, headers=bearer(cluster_a.admin_token)))
            tally = await chaos(pods, client, hub, postgres, seed=20261207)
        with httpx.Client(base_url=hub.url, timeout=30) as client:
            truth = truth_by(pods, key_of)
            admins = {None: cluster_a, MEMBER: cluster_b}
            figures = {key: usage(client, key, run, admins[split_key(key)[0]]) for key in truth}
            everything = chargeback(client, run, cluster_a)
            by_cluster = {cluster: chargeback(client, run, cluster_a, cluster) for cluster in ("", MEMBER)}
            spent = ok(client.get(f"/api/v1/pools/{POOL}", headers=bearer(cluster_a.admin_token)))
    finally:
        webhook_b.stop()
        await hub.kill()

    assert_chaos_happened(tally)
    assert len(truth) == 2 * len(NAMESPACES)
    for key, expected in truth.items():
        charged, raw = figures[key]
        assert abs(charged - expected) <= EXACT, (key, figures, truth)
        assert abs(raw - expected) <= EXACT, (key, figures, truth)  # no weights: raw is charged

    with psycopg.connect(postgres.url.replace("+psycopg", "")) as db:
        ledger = dict(
            db.execute("SELECT namespace, sum(gpu_minutes) FROM usage_ledger GROUP BY namespace").fetchall()
        )
        totals = dict(
            db.execute(
                "SELECT namespace, sum(used_gpu_minutes) FROM usage_totals GROUP BY namespace"
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
    assert ledger.keys() == totals.keys() == truth.keys()
    for key, expected in truth.items():
        assert abs(ledger[key] - expected) <= EXACT, (key, ledger, truth)
        assert abs(totals[key] - expected) <= EXACT, (key, totals, truth)
    assert overlaps == (0,), "a pod's time was charged twice"
    for pod in pods:
        assert charged_seconds[stored_uid(pod)] == run.seconds, pod
        # Acknowledged means committed: every acknowledged report survived the kills and the crashes.
        assert {(stored_uid(pod), seq) for seq in pod.acknowledged} <= stored, pod

    # The export against the usage figures, to docs/billing.md's rounding rule: each export row's minutes
    # are rounded once to NANO, as each of a usage answer's pod rows is, so a namespace's rows and its
    # usage total differ by at most half a NANO per row of either; the totals are exact sums of the rows.
    rows = everything["rows"]
    assert {(row["cluster"], row["namespace"]) for row in rows} == {
        (split_key(key)[0] or "", split_key(key)[1]) for key in truth
    }
    slack: dict[str, Decimal] = {}
    for row in rows:
        key = namespace_key(row["cluster"] or None, row["namespace"])
        slack[key] = slack.get(key, Decimal(0)) + NANO / 2
    for pod in pods:
        slack[key_of(pod)] += NANO / 2
    for key in truth:
        cluster, namespace = split_key(key)
        mine = [r for r in rows if (r["cluster"], r["namespace"]) == (cluster or "", namespace)]
        for figure, column in ((0, "gpu_minutes"), (1, "raw_gpu_minutes")):
            exported = sum((minutes(r[column]) for r in mine), Decimal(0))
            assert abs(exported - figures[key][figure]) <= slack[key], (key, column, mine, figures[key])
    clusters = {entry["cluster"]: entry for entry in everything["totals"]["by_cluster"]}
    assert clusters.keys() == {"", MEMBER}
    for cluster, entry in clusters.items():
        keys = [key for key in truth if (split_key(key)[0] or "") == cluster]
        used = sum((figures[key][0] for key in keys), Decimal(0))
        assert abs(minutes(entry["gpu_minutes"]) - used) <= sum((slack[key] for key in keys), Decimal(0))
        own = by_cluster[cluster]
        assert {row["cluster"] for row in own["rows"]} == {cluster}
        assert own["rows"] == [row for row in rows if row["cluster"] == cluster]
        assert [e["cluster"] for e in own["totals"]["by_cluster"]] == [cluster]
        for column in ("gpu_minutes", "raw_gpu_minutes"):
            exact = sum((minutes(row[column]) for row in own["rows"]), Decimal(0))
            assert minutes(entry[column]) == exact, (cluster, column, entry)
            assert minutes(own["totals"]["by_cluster"][0][column]) == exact
            assert minutes(own["totals"]["all"][column]) == exact
    every = everything["totals"]["all"]
    for column in ("gpu_minutes", "raw_gpu_minutes"):
        assert minutes(every[column]) == sum((minutes(e[column]) for e in clusters.values()), Decimal(0))
    all_used = sum((charged for charged, _ in figures.values()), Decimal(0))
    assert abs(minutes(every["gpu_minutes"]) - all_used) <= sum(slack.values(), Decimal(0))

    # The pool spanning `chaos-x` of both clusters: each member's use is its key's.
    members = {m["namespace"]: Decimal(str(m["used_gpu_minutes"])) for m in spent["members"]}
    assert members.keys() == {"chaos-x", "b/chaos-x"}
    for key, used in members.items():
        assert abs(used - figures[key][0]) <= EXACT, (key, spent, figures)
