"""A hub reconciling its member (issue #42, docs/fleet.md), on two real API servers: the hub's own cluster
is the cluster layer's control plane (`a`, as tests/cluster/test_fleet.py calls it), and member `b` is a
second one, installed from deployment/member, which the hub reaches with the credentials that install
gives it (its `gpu-timekeeper` ServiceAccount, the base's ClusterRole): the reconciler's reads and writes
in b are exactly what the member install grants. The hub runs a reconcile pass per cluster every second.

What it shows: a GPU pod of b whose sidecar never reports is charged by the hub's passes under `b/<ns>`,
once, and the hub's own namespace of the same name is not charged for it; a namespace of b whose budget
is spent and says `evict` loses its running GPU pod in b, which its ReplicaSet recreates at the reduced
class, as the local cluster's does (tests/cluster/test_eviction.py); with b's API server stopped, the
hub's pass of its own cluster still runs, and b's job fails alone.

There is no kubelet: the tests write pods' phases and times through the status subresource.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from gpuaccounting.names import SIDECAR_CONTAINER_NAME
from tests.cluster.harness import (
    SILENT_GRACE_SECONDS,
    set_status,
    stamp,
    terminated,
    wait_for_admission_state,
)
from tests.cluster.test_eviction import mark_running, pods, replica_set
from tests.cluster.test_fleet import (  # noqa: F401 (the fixtures, shared with the fleet test)
    Hub,
    Member,
    MemberInstall,
    cluster_a,
    cluster_b,
    gpu_pod,
    member_install,
    namespace_in,
    webhook_b,
)
from tests.support.processes import TimekeeperProcess, WebhookProcess, free_port, wait_until
from tests.support.timekeeper import migrated_database


@pytest.fixture(scope="module")
def hub(
    cluster_a: Member,  # noqa: F811
    member_install: MemberInstall,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Hub]:
    """`python -m timekeeper` serving its own cluster (a's API server) and member b, reconciling both."""
    folder = tmp_path_factory.mktemp("hub")
    env = {
        "TIMEKEEPER_AUTH_MODE": "kubernetes",
        "TIMEKEEPER_KUBE_IN_CLUSTER": "false",
        "TIMEKEEPER_KUBECONFIG": str(cluster_a.plane.kubeconfig),
        "TIMEKEEPER_MEMBERS": json.dumps({"b": {"kubeconfig": str(member_install.hub_kubeconfig)}}),
        "TIMEKEEPER_RECONCILE": "true",
        "TIMEKEEPER_RECONCILE_INTERVAL_SECONDS": "1",
        "TIMEKEEPER_SILENT_GRACE_SECONDS": str(SILENT_GRACE_SECONDS),
        "TIMEKEEPER_STATES_INTERVAL": "1",
        "TIMEKEEPER_LEADER_RETRY_INTERVAL": "0.5",
        "TIMEKEEPER_LEADER_CHECK_TIMEOUT": "10",
        "TIMEKEEPER_LOG_FORMAT": "json",
    }
    with migrated_database("gtk_fleet_reconcile") as database:
        process = TimekeeperProcess(database, env, free_port(), folder / "timekeeper.log")
        process.start()
        yield Hub(process)
        process.stop()


def charged(hub: Hub, member: Member, cluster: str | None, namespace: str) -> Decimal:
    """A namespace's charged use, whatever period it fell in, as its cluster's admin reads it (None: the
    hub's own cluster)."""
    path = f"/namespaces/{namespace}/usage?since=2000-01-01T00:00:00Z"
    return Decimal(str(hub.ok("GET", path, member.admin_token, cluster)["total_gpu_minutes"]))


def jobs(hub: Hub, admin: Member) -> dict[str, Any]:
    """The hub's periodic jobs' health, as /readyz shows it to an admin of its own cluster."""
    return dict(hub.ok("GET", "/readyz", admin.admin_token)["scheduler"]["jobs"])


def another_pass(hub: Hub, admin: Member, job: str) -> None:
    """Wait for the job to do the work of one more window."""
    last = jobs(hub, admin)[job]["last_success"]
    wait_until(lambda: jobs(hub, admin)[job]["last_success"] != last, timeout=30, what=f"a {job} pass")


def ran_for(member: Member, namespace: str, name: str, minutes: int) -> None:
    """The pod started 10 minutes ago and its containers (our sidecar's, never run, included) ended
    `minutes` later, as a kubelet would write it."""
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    stored = member.kubectl.json("get", "pod", name, "-n", namespace)
    status = {
        "phase": "Succeeded",
        "startTime": stamp(start),
        "containerStatuses": terminated(stored, start + timedelta(minutes=minutes)),
    }
    set_status(member.kubectl, namespace, name, status)


def test_a_silent_pod_of_b_is_charged_under_bs_key_once_and_not_to_the_hubs_namesake(
    cluster_a: Member,  # noqa: F811
    cluster_b: Member,  # noqa: F811
    hub: Hub,
    webhook_b: WebhookProcess,  # noqa: F811
) -> None:
    """b's pod ran 6 minutes and its sidecar (injected by b's webhook) never reported; the hub's own
    team-s has a pod of the same name that ran 2."""
    team_a, team_b = namespace_in(cluster_a, "team-s"), namespace_in(cluster_b, "team-s")
    theirs = gpu_pod(cluster_b, team_b, "trainer")
    assert SIDECAR_CONTAINER_NAME in [c["name"] for c in theirs["spec"]["containers"]]
    gpu_pod(cluster_a, team_a, "trainer")
    ran_for(cluster_b, team_b, "trainer", 6)
    ran_for(cluster_a, team_a, "trainer", 2)

    wait_until(lambda: charged(hub, cluster_b, "b", team_b) > 0, timeout=60, what="b's pod charged")
    wait_until(lambda: charged(hub, cluster_a, None, team_a) > 0, timeout=60, what="the hub's pod charged")
    for _ in range(2):  # two more passes of each cluster: they must charge nothing more
        for job in ("reconcile", "reconcile:b"):
            another_pass(hub, cluster_a, job)

    assert charged(hub, cluster_b, "b", team_b) == 6  # once, under b's key
    assert charged(hub, cluster_a, None, team_a) == 2  # the hub's own team-s: its own pod only
    usage = hub.ok(
        "GET",
        f"/namespaces/{team_b}/usage?group_by=pod&since=2000-01-01T00:00:00Z",
        cluster_b.admin_token,
        "b",
    )
    assert [(row["key"], Decimal(str(row["gpu_minutes"]))) for row in usage["rows"]] == [("trainer", 6)]


def test_an_exhausted_namespace_of_b_that_says_evict_has_its_running_pod_recreated_at_the_reduced_class(
    cluster_b: Member,  # noqa: F811
    hub: Hub,
    webhook_b: WebhookProcess,  # noqa: F811
) -> None:
    team = namespace_in(cluster_b, "team-e")
    kubectl = cluster_b.kubectl

    def budget(**fields: Any) -> None:
        hub.ok("PUT", f"/namespaces/{team}/budget", cluster_b.admin_token, "b", body=fields)

    budget(budget_gpu_minutes=1000)
    wait_for_admission_state(kubectl, team, "in_budget")
    kubectl.create(replica_set(team, "worker"))
    wait_until(lambda: pods(kubectl, team, "worker"), timeout=30, what="the ReplicaSet's pod")
    [worker] = pods(kubectl, team, "worker")
    assert worker["spec"]["priorityClassName"] == "gpu-in-budget"
    mark_running(kubectl, team, worker["metadata"]["name"])

    # Exhausted first, so b's webhook knows before the replacement arrives; then the action.
    budget(budget_gpu_minutes=0)
    wait_for_admission_state(kubectl, team, "exhausted")
    budget(budget_gpu_minutes=0, running_pod_action="evict")

    def replaced() -> list[dict[str, Any]]:
        return [p for p in pods(kubectl, team, "worker") if p["metadata"]["uid"] != worker["metadata"]["uid"]]

    wait_until(replaced, timeout=60, what="the ReplicaSet's replacement of the evicted pod")
    [replacement] = replaced()
    assert replacement["spec"]["priorityClassName"] == "gpu-over-budget"
    events = kubectl.json("get", "events", "-n", team)["items"]
    downgraded = [
        e["involvedObject"]["name"]
        for e in events
        if e["reason"] == "GPUBudgetDowngrade" and e["involvedObject"]["kind"] == "Pod"
    ]
    assert downgraded == [worker["metadata"]["name"]]


def test_with_bs_api_server_stopped_the_hubs_own_pass_still_runs(
    cluster_a: Member,  # noqa: F811
    cluster_b: Member,  # noqa: F811
    hub: Hub,
) -> None:
    """Last in the module: it stops b's control plane for good."""

    wait_until(lambda: jobs(hub, cluster_a)["reconcile:b"]["outcome"] == "ok", timeout=30, what="a pass of b")
    cluster_b.plane.down()
    wait_until(
        lambda: jobs(hub, cluster_a)["reconcile:b"]["outcome"] == "error", timeout=60, what="b's pass failing"
    )

    team = namespace_in(cluster_a, "team-d")
    gpu_pod(cluster_a, team, "trainer")
    ran_for(cluster_a, team, "trainer", 3)

    wait_until(lambda: charged(hub, cluster_a, None, team) > 0, timeout=60, what="the hub's pod charged")
    assert charged(hub, cluster_a, None, team) == 3
    assert jobs(hub, cluster_a)["reconcile:b"]["outcome"] == "error"
    assert jobs(hub, cluster_a)["reconcile"]["outcome"] in ("ok", "skipped")
