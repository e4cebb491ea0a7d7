"""GPUBudget objects of a fleet's member (docs/fleet.md, docs/gitops.md), on two real API servers: the
cluster layer's control plane is the hub's own cluster `a`, and a second one is member `b`, installed from
deployment/member (its GPUBudget CRD and RBAC included) with the hub's kubeconfig built from the member's
token Secret, as tests/cluster/test_fleet.py does. The hub runs the GPUBudget sync (a pass a second) for
its own cluster and for `b`, reaching `b` with those credentials only.

What it shows: a GPUBudget created in b sets the budget of `b/team-x` and nothing of the hub's `team-x`;
its status in b says so; an update follows; deleting it in b returns `b/team-x` to the default and gives
it back to the REST API, as deleting one in the hub's own cluster does. The hub's credentials in b may
list and watch GPUBudgets and update their status, and nothing more of them.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.cluster.harness import Kubectl, KubectlError
from tests.cluster.test_fleet import (  # noqa: F401  (module-scoped fixtures, one control plane b here)
    Hub,
    Member,
    MemberInstall,
    cluster_a,
    cluster_b,
    member_install,
    namespace_in,
)
from tests.cluster.test_gitops import SYNC_SECONDS, apply, gpubudget, wait_for_status
from tests.support.processes import TimekeeperProcess, free_port, wait_until
from tests.support.timekeeper import migrated_database

MEMBER_NAMESPACE = "team-x"
# The hub's own namespace of the same name: budgeted through the REST API, never a GPUBudget of b's.
HUB_NAMESPACE = "team-x"
HUB_ACCOUNT = "system:serviceaccount:gpu-timekeeper:gpu-timekeeper"


@pytest.fixture(scope="module")
def gitops_hub(
    cluster_a: Member,  # noqa: F811
    member_install: MemberInstall,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Hub]:
    """`python -m timekeeper` serving its own cluster (a's API server) and member b, with the GPUBudget
    sync on: a pass a second, statuses written as soon as they move."""
    folder = tmp_path_factory.mktemp("gitops-hub")
    # The hub's own cluster serves the CRDs too (as every single-cluster install does).
    cluster_a.kubectl.run("apply", "-k", str(Path(__file__).parents[2] / "deployment" / "base" / "crds"))
    env = {
        "TIMEKEEPER_AUTH_MODE": "kubernetes",
        "TIMEKEEPER_KUBE_IN_CLUSTER": "false",
        "TIMEKEEPER_KUBECONFIG": str(cluster_a.plane.kubeconfig),
        "TIMEKEEPER_MEMBERS": json.dumps({"b": {"kubeconfig": str(member_install.hub_kubeconfig)}}),
        "TIMEKEEPER_GITOPS": "true",
        "TIMEKEEPER_GITOPS_INTERVAL_SECONDS": "1",
        "TIMEKEEPER_GITOPS_STATUS_INTERVAL_SECONDS": "0",
        "TIMEKEEPER_LOG_FORMAT": "json",
    }
    with migrated_database("gtk_fleet_gitops") as database:
        process = TimekeeperProcess(database, env, free_port(), folder / "timekeeper.log")
        process.start()
        yield Hub(process)
        process.stop()


def budget_of(hub: Hub, member: Member, cluster: str | None, namespace: str) -> dict[str, Any]:
    """A namespace's budget as its own cluster's admin reads it at the hub."""
    answer: dict[str, Any] = hub.ok("GET", f"/namespaces/{namespace}/budget", member.admin_token, cluster)
    return answer


def minutes(budget: dict[str, Any]) -> Decimal | None:
    value = budget["budget_gpu_minutes"]
    return None if value is None else Decimal(str(value))


def audit_actors(hub: Hub, admin: Member, key: str) -> list[tuple[str, str]]:
    """(actor, action) of a namespace key's audit entries, newest first, as the hub's own admin reads them."""
    entries = hub.ok("GET", f"/audit?namespace={quote(key, safe='')}", admin.admin_token)
    return [(entry["actor"], entry["action"]) for entry in entries]


def can_i(kubectl: Kubectl, *request: str) -> bool:
    """`kubectl auth can-i` as `kubectl`'s credentials: whether that API server allows the request (it
    answers `yes` with status 0, `no` with 1)."""
    done = subprocess.run(
        ["kubectl", "auth", "can-i", *request],
        env={**os.environ, "KUBECONFIG": str(kubectl.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    answer = done.stdout.strip()
    assert (done.returncode, answer) in ((0, "yes"), (1, "no")), done.stderr
    return answer == "yes"


def test_a_gpubudget_in_member_b_sets_b_team_x_alone_and_deleting_it_releases_it(
    cluster_a: Member,  # noqa: F811
    cluster_b: Member,  # noqa: F811
    gitops_hub: Hub,
) -> None:
    hub = gitops_hub
    team = namespace_in(cluster_b, MEMBER_NAMESPACE)
    hub.ok(
        "PUT", f"/namespaces/{HUB_NAMESPACE}/budget", cluster_a.admin_token, body={"budget_gpu_minutes": 500}
    )

    apply(cluster_b.kubectl, gpubudget(team, budgetGPUMinutes=1000, period="monthly"))

    wait_until(
        lambda: minutes(budget_of(hub, cluster_b, "b", team)) == 1000,
        timeout=SYNC_SECONDS,
        what="b's GPUBudget to become b/team-x's budget",
    )
    status = wait_for_status(
        cluster_b.kubectl,
        team,
        "the status in b",
        budgetGPUMinutes="1000",
        state="in_budget",
        conditions={"Ready": "True"},
    )
    assert status["observedGeneration"] == 1
    # The hub's own team-x: its REST budget, still the REST API's to change.
    assert minutes(budget_of(hub, cluster_a, None, HUB_NAMESPACE)) == 500
    hub.ok(
        "PUT", f"/namespaces/{HUB_NAMESPACE}/budget", cluster_a.admin_token, body={"budget_gpu_minutes": 501}
    )
    # b's team-x is the object's: b's own admin is refused the REST write, naming it.
    refused = hub.request(
        "PUT", f"/namespaces/{team}/budget", cluster_b.admin_token, "b", body={"budget_gpu_minutes": 5}
    )
    assert refused.status_code == 409 and "GPUBudget" in refused.text, refused.text
    assert audit_actors(hub, cluster_a, f"b/{team}") == [("gitops:GPUBudget b/team-x/budget", "budget.put")]
    assert all(not actor.startswith("gitops:") for actor, _ in audit_actors(hub, cluster_a, HUB_NAMESPACE))

    apply(cluster_b.kubectl, gpubudget(team, budgetGPUMinutes=2000, period="monthly"))
    wait_for_status(
        cluster_b.kubectl, team, "the update's status in b", budgetGPUMinutes="2000", observedGeneration=2
    )
    assert minutes(budget_of(hub, cluster_b, "b", team)) == 2000

    cluster_b.kubectl.run("delete", "gpubudget", "budget", "-n", team)

    wait_until(
        lambda: budget_of(hub, cluster_b, "b", team)["source"] == "default",
        timeout=SYNC_SECONDS,
        what="b/team-x back on the default",
    )
    assert audit_actors(hub, cluster_a, f"b/{team}")[0] == (
        "gitops:GPUBudget b/team-x/budget (deleted)",
        "budget.delete",
    )
    hub.ok("PUT", f"/namespaces/{team}/budget", cluster_b.admin_token, "b", body={"budget_gpu_minutes": 7})
    assert minutes(budget_of(hub, cluster_a, None, HUB_NAMESPACE)) == 501


def test_the_hubs_credentials_in_b_list_and_watch_gpubudgets_and_write_their_status_only(
    cluster_b: Member,  # noqa: F811
    member_install: MemberInstall,  # noqa: F811
) -> None:
    """As the hub reaches b (the kubeconfig from deployment/member's token Secret), asked of b's API
    server."""
    as_hub = Kubectl(member_install.hub_kubeconfig)
    resource = "gpubudgets.gpu-timekeeper.io"
    assert can_i(as_hub, "list", resource, "-A") and can_i(as_hub, "watch", resource, "-A")
    assert can_i(as_hub, "update", resource, "--subresource=status", "-n", "team-any")
    for verb in ("get", "create", "update", "patch", "delete"):
        assert not can_i(as_hub, verb, resource, "-n", "team-any"), verb
    assert not can_i(as_hub, "list", "gpubudgetdefaults.gpu-timekeeper.io")
    # And no GPUBudgetDefault is served in a member: the default is the hub's.
    with pytest.raises(KubectlError):
        cluster_b.kubectl.run("get", "crd", "gpubudgetdefaults.gpu-timekeeper.io")
