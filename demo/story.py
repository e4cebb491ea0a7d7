"""The demo's script: three namespaces with monthly budgets, GPU pods of several sharing systems admitted
through the webhook, one namespace spending its budget (warning, then exhausted), its next pod getting the
reduced class, invalid requests denied, an admin grant restoring the budget, its next pod in budget again,
and the month rolling over so every budget starts again.

Time is compressed: the timekeeper and the sidecars share one accelerated clock (a simulated day per real
second, demo.cluster, from 9 March), so budgets are realistic GPU-minutes a month and April comes in
23 real seconds.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demo.cluster import REPORT_INTERVAL_SECONDS, Child, DemoError, LocalCluster, base_env
from demo.pods import Admitted, PodSpec, admit, sidecar_command
from demo.view import Board, View, minutes, outlook

POLL_SECONDS = 0.25
# Real seconds; at a simulated day per second the rest of March takes 23.
EXHAUSTION_TIMEOUT_SECONDS = 60.0
WEBHOOK_SYNC_TIMEOUT_SECONDS = 15.0
ROLLOVER_TIMEOUT_SECONDS = 45.0

SPENDER = "vision"  # the namespace that runs out
BUDGETS: dict[str, dict[str, Any]] = {
    # 15,000 GPU-minutes = 250 GPU-hours: the 1.5 GPUs of its first pods spend it in about a week.
    SPENDER: {"budget_gpu_minutes": 15_000, "period": "monthly", "warn_at_fraction": 0.8},
    # 0.68 GPUs use about 30,000 of it in a month.
    "nlp": {"budget_gpu_minutes": 50_000, "period": "monthly", "max_gpu_share_per_pod": 1},
    "research": {"budget_gpu_minutes": None, "period": "monthly"},
}
# Enough to be in budget (below the warning line) again however far past the budget vision got while
# the demo waited for the webhook, and to last a few simulated days.
GRANT = {"gpu_minutes": 15_000, "reason": "paper deadline on Friday"}

FIRST_PODS = (
    PodSpec(SPENDER, "train-resnet", "nvidia (whole GPU)", {"nvidia.com/gpu": "1"}),
    PodSpec(SPENDER, "augment", "HAMi", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50"}),
    PodSpec("nlp", "finetune-llm", "NVIDIA MIG", {"nvidia.com/mig-3g.40gb": "1"}),
    PodSpec("nlp", "tokenizer", "ClearML", {}, labels={"clearml-injector/fraction": "0.25"}),
    PodSpec("research", "notebook", "KAI / Run:ai", {}, annotations={"gpu-fraction": "0.5"}),
    PodSpec(
        "research",
        "simulate",
        "gpu-manager (vcuda)",
        {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "16"},
    ),
)
INVALID_PODS = (
    PodSpec("nlp", "odd-fraction", "ClearML", {}, labels={"clearml-injector/fraction": "0.3"}),
    PodSpec(
        "research",
        "too-much-core",
        "gpu-manager (vcuda)",
        {"tencent.com/vcuda-core": "150", "tencent.com/vcuda-memory": "16"},
    ),
    PodSpec("nlp", "two-gpus", "nvidia (whole GPU)", {"nvidia.com/gpu": "2"}),
)
OVER_BUDGET_POD = PodSpec(SPENDER, "eval-1", "cnvrg MetaGPU", {"cnvrg.io/metagpu": "50"})
AFTER_GRANT_POD = PodSpec(SPENDER, "eval-2", "Aliyun gpushare", {"aliyun.com/gpu-mem": "20"})

_STATE_VERSION = re.compile(r"^webhook_state_version\s+(\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class Running:
    admitted: Admitted
    sidecar: Child


class Story:
    def __init__(self, cluster: LocalCluster, view: View, board: Board) -> None:
        self.cluster = cluster
        self.view = view
        self.board = board
        self.admin = cluster.api_client(cluster.tokens.admin)
        self.reader = cluster.api_client(cluster.tokens.reader)
        self.webhook = cluster.webhook_client()
        self.running: list[Running] = []
        # The newest budget event already told, per namespace (GET .../budget/events).
        self.told_event: dict[str, int] = {}
        # The state the polls told a namespace reaching before the timekeeper had recorded that transition
        # (a new period's exhausted -> in_budget): the events up to it, once recorded, are not told again.
        self.told_by_polls: dict[str, str] = {}

    def say(self, text: str, style: str = "") -> None:
        self.view.event(self.board, text, style)

    # --- watching the timekeeper -------------------------------------------------------------------

    def poll(self) -> None:
        """Read every namespace's status; a change of state is an event. A sidecar that died is a failure."""
        for run in self.running:
            if not run.sidecar.running():
                raise run.sidecar.failure("stopped unexpectedly")
        response = self.reader.get("/namespaces")
        response.raise_for_status()
        statuses = response.json()
        self.announce_new_period(statuses)
        for status in statuses:
            name = status["namespace"]
            before = self.board.status.get(name)
            self.board.status[name] = status
            if before is None:
                self.told_event[name] = max((event["id"] for event in self.events(name)), default=0)
            elif before["state"] != status["state"]:
                self.announce_transitions(name, before["state"], status)
        self.view.refresh(self.board)

    def events(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's latest budget-state transitions, oldest first."""
        response = self.reader.get(f"/namespaces/{namespace}/budget/events", params={"limit": 100})
        response.raise_for_status()
        return sorted(response.json(), key=lambda event: int(event["id"]))

    def announce_transitions(self, name: str, before: str, status: dict[str, Any]) -> None:
        """Every transition up to the state now shown, from the timekeeper's record of them rather than
        the two polls': vision spends from its warning line to exhausted in about 1.4 real seconds, which
        one poll late on a loaded machine skipped (the story then lacked its warning). Transitions
        recorded after this poll's read are told at the next one, except those the polls already told."""
        recent = [event for event in self.events(name) if event["id"] > self.told_event.get(name, 0)]
        if name in self.told_by_polls:
            covered = [n for n, event in enumerate(recent) if event["new_state"] == self.told_by_polls[name]]
            if covered:
                self.told_event[name] = recent[covered[0]]["id"]
                recent = recent[covered[0] + 1 :]
                del self.told_by_polls[name]
        reached = [n for n, event in enumerate(recent) if event["new_state"] == status["state"]]
        steps = [(before, str(status["state"]))]
        if not reached:
            self.told_by_polls[name] = str(status["state"])
        else:
            told = recent[: reached[-1] + 1]
            self.told_event[name] = told[-1]["id"]
            steps = [
                (event["old_state"], event["new_state"]) for event in told if event["old_state"]
            ] or steps
        for old, new in steps[:-1]:
            self.say(f"{name}: {old} -> {new}", "bold red" if new == "exhausted" else "yellow")
        old, new = steps[-1]
        forecast = outlook(status)
        self.say(
            f"{name}: {old} -> {new} (used "
            f"{minutes(status['used_gpu_minutes'])} of "
            f"{minutes(status['budget_gpu_minutes'])} + {minutes(status['granted_gpu_minutes'])} "
            "granted GPU-min)" + (f"; forecast: {forecast}" if forecast else ""),
            "bold red" if new == "exhausted" else "yellow",
        )

    def announce_new_period(self, statuses: list[dict[str, Any]]) -> None:
        """One line when budget periods roll over (the timekeeper starts them on its own clock)."""
        renewed = [
            status
            for status in statuses
            if (before := self.board.status.get(status["namespace"])) is not None
            and before["period"]["start"] != status["period"]["start"]
        ]
        if renewed:
            period = renewed[0]["period"]
            self.say(
                f"new budget period {period['start'][:10]} ({period['kind']}): "
                f"{', '.join(s['namespace'] for s in renewed)} start again from 0 GPU-min used",
                "bold cyan",
            )

    def period_start(self, namespace: str) -> str | None:
        status = self.board.status.get(namespace)
        return None if status is None else str(status["period"]["start"])

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            if condition():
                return
            if time.monotonic() > deadline:
                raise DemoError(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(POLL_SECONDS)

    def state(self, namespace: str) -> str | None:
        status = self.board.status.get(namespace)
        return None if status is None else str(status["state"])

    def webhook_state_version(self) -> float:
        found = _STATE_VERSION.search(self.webhook.get("/metrics").text)
        return float(found.group(1)) if found else -1.0

    def sync_webhook(self) -> None:
        """Wait until the webhook's cached admission state has caught up with the timekeeper's, as it
        does on its own within a poll interval; the demo waits so its story is deterministic."""
        response = self.reader.get("/admission-state")
        response.raise_for_status()
        version = response.json()["version"]
        self.wait_for(
            lambda: self.webhook_state_version() >= version,
            WEBHOOK_SYNC_TIMEOUT_SECONDS,
            f"the webhook to load admission state version {version}",
        )

    # --- acting --------------------------------------------------------------------------------------

    def create(self, spec: PodSpec) -> None:
        """Admit a pod through the webhook; when it is let in, start its sidecar as a kubelet would."""
        result = admit(self.webhook, spec)
        where = f"{spec.namespace}/{spec.name} ({spec.system})"
        if not isinstance(result, Admitted):
            self.say(f"denied {where}: {result.message}", "magenta")
            return
        self.say(
            f"admitted {where}, GPU share {result.share}, priority class {result.priority_class}"
            f" ({result.decision})",
            "bold red" if result.over_budget else "green",
        )
        self.board.add_pod(result)
        argv, env = sidecar_command(
            result,
            self.cluster.workdir / "pods" / spec.namespace / spec.name,
            self.cluster.tokens.reporter,
            {**base_env(), **self.cluster.sidecar_env()},
        )
        self.running.append(
            Running(result, self.cluster.spawn(f"sidecar-{spec.namespace}-{spec.name}", argv, env))
        )

    def put_budgets(self) -> None:
        for namespace, body in BUDGETS.items():
            self.admin.put(f"/namespaces/{namespace}/budget", json=body).raise_for_status()
        described = []
        for namespace, body in BUDGETS.items():
            text = f"{namespace} {minutes(body['budget_gpu_minutes'])} GPU-min/{body['period']}"
            if body.get("max_gpu_share_per_pod"):
                text += f" (at most {body['max_gpu_share_per_pod']} GPU per pod)"
            described.append(text)
        self.say("budgets set: " + ", ".join(described))

    def grant(self) -> None:
        self.admin.post(f"/namespaces/{SPENDER}/grants", json=GRANT).raise_for_status()
        self.say(
            f"admin grant: {SPENDER} +{minutes(GRANT['gpu_minutes'])} GPU-min ({GRANT['reason']!r})", "cyan"
        )

    def stop_pods(self) -> None:
        """SIGTERM, as a pod's deletion sends it: every sidecar flushes a final report."""
        for run in self.running:
            run.sidecar.signal_stop()
        for run in self.running:
            run.sidecar.wait_stopped()
        self.say(f"stopped {len(self.running)} pods (SIGTERM: each sidecar flushes a final report)")
        self.running.clear()

    # --- the script ----------------------------------------------------------------------------------

    def play(self) -> None:
        self.put_budgets()
        self.sync_webhook()
        for spec in FIRST_PODS:
            self.create(spec)
        for spec in INVALID_PODS:
            self.create(spec)
        holding = sum(float(admitted.share) for admitted in self.board.pods[SPENDER])
        self.say(
            f"{SPENDER} holds {holding:g} GPUs against a budget of "
            f"{minutes(BUDGETS[SPENDER]['budget_gpu_minutes'])} GPU-min a month; a simulated day passes "
            f"every real second and sidecars report every {REPORT_INTERVAL_SECONDS // 3600} simulated hours"
        )
        self.wait_for(
            lambda: self.state(SPENDER) == "exhausted",
            EXHAUSTION_TIMEOUT_SECONDS,
            f"{SPENDER} to be exhausted",
        )
        self.sync_webhook()
        self.create(OVER_BUDGET_POD)
        self.grant()
        self.wait_for(lambda: self.state(SPENDER) == "in_budget", WEBHOOK_SYNC_TIMEOUT_SECONDS, "the grant")
        self.sync_webhook()
        self.create(AFTER_GRANT_POD)
        month = self.period_start(SPENDER)
        self.wait_for(lambda: self.period_start(SPENDER) != month, ROLLOVER_TIMEOUT_SECONDS, "the next month")
        # The state sweep (every real second) then finds vision back in budget.
        self.wait_for(
            lambda: self.state(SPENDER) == "in_budget", WEBHOOK_SYNC_TIMEOUT_SECONDS, "the new month's state"
        )

    def serve(self) -> None:
        """--serve: keep watching until Ctrl-C."""
        self.view.resume(self.board)
        while True:
            self.poll()
            time.sleep(POLL_SECONDS)

    def explore_lines(self, serving: bool) -> list[str]:
        url = self.cluster.timekeeper_url
        auth = '-H "Authorization: Bearer $TOKEN"'
        lines = [
            "",
            "Summary: "
            + "; ".join(
                f"{name} {status['state']} (used {minutes(status['used_gpu_minutes'])} GPU-min)"
                for name, status in sorted(self.board.status.items())
            ),
            "",
            "Explore further"
            + (
                " (Ctrl-C stops everything):" if serving else " (run `make demo ARGS=--serve` to keep it up):"
            ),
            f"  dashboard:       {url}/ui  (sign in with the admin token below)",
            f"  API docs:        {url}/docs",
            f"  admin token:     export TOKEN={self.cluster.tokens.admin}",
            f"  CLI:             export GPU_BUDGET_URL={url} GPU_BUDGET_TOKEN=$TOKEN; "
            f"{self.cluster.bin_dir}/gpu-budget forecast  (also status, usage {SPENDER} --by day, top, "
            "grant, audit; `kubectl gpu-budget` with that bin on the PATH)",
            f"  budgets:         curl -s {auth} {url}/api/v1/namespaces",
            f"  where it went:   curl -s {auth} '{url}/api/v1/namespaces/{SPENDER}/usage?group_by=pod'",
            f"  audit log:       curl -s {auth} {url}/api/v1/audit",
            f"  grant more:      curl -s -X POST {auth} -H 'Content-Type: application/json' "
            f"""-d '{{"gpu_minutes": 1000, "reason": "more"}}' {url}/api/v1/namespaces/{SPENDER}/grants""",
            f"  webhook metrics: curl -s --cacert {self.cluster.ca_file} {self.cluster.webhook_url}/metrics",
        ]
        if serving:
            lines.append(f"  logs:            {self.cluster.logs}")
        return lines

    def run(self, serve: bool) -> None:
        self.play()
        if not serve:
            self.stop_pods()
            self.poll()
        self.view.summary(self.board, self.explore_lines(serve))
        if serve:
            self.serve()

    def close(self) -> None:
        for client in (self.admin, self.reader, self.webhook):
            client.close()


def working_folder_note(path: Path) -> str:
    return f"working folder {path} (database, certificates, tokens, logs; removed at exit)"
