"""The shipped alerts and dashboard against a real Prometheus scraping a real timekeeper (on a PostgreSQL of
the test's own, which it stops) and a real webhook, with the ServiceMonitors' job names, labels and auth.

Each fault an alert is for that can be caused here is caused, and the alert must reach `firing` in
Prometheus' /api/v1/alerts and leave it once the fault is gone. The rules are the shipped PrometheusRule's,
except that every `for:` is shortened to FOR in the test's copy (nothing else is changed: the thresholds
and ranges are the shipped ones). The alerts this layer cannot cause are listed in docs/runbooks.md
("What the real-Prometheus test cannot cause") with why; a test keeps that list and the rules in step.

The processes are shared by the module's tests, which run in order (each leaves them healthy).
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from sqlalchemy.engine import make_url

from gpuaccounting.wire import BUDGET_STATES
from tests.deployment.conftest import required
from tests.deployment.test_monitoring import RUNBOOKS, alerts, dashboard, rule_groups, series_names
from tests.support.loopback import LoopbackServer
from tests.support.pods import container, pod, review
from tests.support.processes import LOCAL_HTTP, TimekeeperProcess, WebhookProcess, free_port, wait_until
from tests.support.prometheus import INTERVAL, PrometheusProcess, prometheus_binary
from tests.support.throwaway_postgres import ThrowawayPostgres, throwaway_postgres
from tests.support.timekeeper import Tokens, bearer, migrate, report_body, sha256
from webhook.certificates.tls import generate_ca, generate_serving_cert

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus]

# Every rule's `for:` in the test's copy: one evaluation pending, then firing.
FOR = "500ms"
WEBHOOK_SERVER_NAME = "gpu-timekeeper-webhook.gpu-timekeeper.svc"
# Metrics that cannot have a series here, and why (each is named by the rules or the dashboard).
NO_SERIES_HERE = {
    "timekeeper_silent_gpu_pods": "the reconciler's pod watch, which needs a Kubernetes API (tests/cluster)",
    "timekeeper_running_gpu_pods": "the reconciler's pod watch, which needs a Kubernetes API (tests/cluster)",
}
# The table the roll-up job writes: renamed away before the timekeeper starts, so the job never succeeds.
# The roll-up job is the only writer that deletes the forecast's old burn buckets: a statement trigger
# refusing that delete fails the job and nothing else.
ROLLUP_FAULT = (
    "CREATE FUNCTION refuse_rollup() RETURNS trigger LANGUAGE plpgsql AS "
    "$$BEGIN RAISE EXCEPTION 'the roll-up is refused'; END$$; "
    "CREATE TRIGGER refuse_rollup BEFORE DELETE ON usage_burn FOR EACH STATEMENT "
    "EXECUTE FUNCTION refuse_rollup()"
)
ROLLUP_FIXED = "DROP TRIGGER refuse_rollup ON usage_burn; DROP FUNCTION refuse_rollup()"


@dataclass
class Stack:
    postgres: ThrowawayPostgres
    timekeeper: TimekeeperProcess
    webhook: WebhookProcess
    webhook_env: dict[str, str]
    prometheus: PrometheusProcess
    tokens: Tokens
    ca: bytes
    workdir: Path
    # Unix times the dashboard is evaluated at: "quiet" before any traffic, "busy" with every kind of it.
    moments: dict[str, float] = field(default_factory=dict)
    client: httpx.Client = field(default_factory=httpx.Client)  # kept alive: traffic is quick

    def sql(self, statement: str) -> None:
        with psycopg.connect(self.postgres.server.get_uri(), autocommit=True) as connection:
            connection.execute(statement)  # type: ignore[arg-type]

    def report(self, token: str | None = None, **fields: Any) -> httpx.Response:
        return self.client.post(
            f"{self.timekeeper.url}/api/v1/reports",
            json=report_body(**fields),
            headers=bearer(token or self.tokens.reporter),
            timeout=10,
        )

    def admin(self, method: str, path: str, body: dict[str, Any]) -> None:
        response = LOCAL_HTTP.request(
            method,
            f"{self.timekeeper.url}/api/v1{path}",
            json=body,
            headers=bearer(self.tokens.admin),
            timeout=10,
        )
        assert response.is_success, response.text

    def stop_timekeeper(self) -> None:
        """First the test's keep-alive connection, which the server would wait for."""
        self.client.close()
        self.client = httpx.Client()
        self.timekeeper.stop()

    def restart_webhook(self, **env: str) -> None:
        """A new webhook process on the same port (its client closes with the old one)."""
        self.webhook.stop()
        self.webhook = WebhookProcess(
            {**self.webhook_env, **env}, self.webhook.port, self.ca, self.workdir / "webhook.log"
        )
        self.webhook.start()

    def value(self, expression: str) -> float | None:
        result = self.prometheus.query(expression)
        return float(result[0]["value"][1]) if result else None


def shortened_rules() -> list[dict[str, Any]]:
    """The shipped rule groups, evaluated every INTERVAL, every `for:` shortened to FOR."""
    groups = yaml.safe_load(yaml.safe_dump(rule_groups()))
    for group in groups:
        group["interval"] = INTERVAL
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = FOR
    return groups


def scrape_configs(stack_dir: Path, timekeeper_port: int, webhook_port: int, metrics_token: str) -> list[Any]:
    """What the ServiceMonitors (deployment/components/prometheus/servicemonitors.yaml) make the Prometheus
    Operator generate: the fixed job names, honor_labels, a bearer token for the timekeeper (its budgets
    are private), HTTPS with the certificate's CA for the webhook; `pod` as the operator adds it."""
    return [
        {
            "job_name": "gpu-timekeeper",
            "honor_labels": True,
            "metrics_path": "/metrics",
            "authorization": {"type": "Bearer", "credentials": metrics_token},
            "static_configs": [
                {"targets": [f"127.0.0.1:{timekeeper_port}"], "labels": {"pod": "timekeeper-0"}}
            ],
        },
        {
            "job_name": "gpu-timekeeper-webhook",
            "honor_labels": True,
            "metrics_path": "/metrics",
            "scheme": "https",
            "tls_config": {"ca_file": str(stack_dir / "ca.crt"), "server_name": WEBHOOK_SERVER_NAME},
            "static_configs": [{"targets": [f"127.0.0.1:{webhook_port}"], "labels": {"pod": "webhook-0"}}],
        },
    ]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = str(
        required(prometheus_binary(), "no prometheus: apt-get install prometheus (hack/test-deps.sh does)")
    )
    workdir = tmp_path_factory.mktemp("monitoring")
    tokens, metrics_token = Tokens(), secrets.token_urlsafe(24)
    ca_cert, ca_key = generate_ca("monitoring CA")
    cert, key = generate_serving_cert(
        ca_cert, ca_key, "gpu-timekeeper-webhook", "gpu-timekeeper", extra_sans=("127.0.0.1",)
    )
    (workdir / "ca.crt").write_bytes(ca_cert)
    (workdir / "tls.crt").write_bytes(cert)
    (workdir / "tls.key").write_bytes(key)
    (workdir / "webhook-token").write_text(tokens.reader)
    timekeeper_port, webhook_port = free_port(), free_port()
    prometheus = PrometheusProcess(
        workdir, scrape_configs(workdir, timekeeper_port, webhook_port, metrics_token), shortened_rules()
    )
    # First: Prometheus scrapes a static target only some seconds after it starts (its discovery updates
    # are throttled), seconds the database and the processes take to start meanwhile.
    prometheus.start(binary)
    try:
        with throwaway_postgres() as postgres:
            ports = (timekeeper_port, webhook_port)
            yield from _running_stack(postgres, prometheus, ports, tokens, metrics_token, ca_cert, workdir)
    finally:
        prometheus.stop()


def _running_stack(
    postgres: ThrowawayPostgres,
    prometheus: PrometheusProcess,
    ports: tuple[int, int],
    tokens: Tokens,
    metrics_token: str,
    ca_cert: bytes,
    workdir: Path,
) -> Iterator[Stack]:
    """The timekeeper and the webhook on the `ports` Prometheus scrapes, once three scrapes of each have
    succeeded."""
    migrate(make_url(postgres.url))
    timekeeper = TimekeeperProcess(
        make_url(postgres.url),
        {
            **tokens.env(),
            "TIMEKEEPER_METRICS_AUTH": "token",
            "TIMEKEEPER_METRICS_TOKEN_SHA256": sha256(metrics_token),
            "TIMEKEEPER_LEADER_RETRY_INTERVAL": "0.5",
            "TIMEKEEPER_STATES_INTERVAL": "1",
            "TIMEKEEPER_CLOSEOUT_INTERVAL": "1",
            "TIMEKEEPER_ROLLUP_INTERVAL": "1",
            "TIMEKEEPER_LEDGER_RETENTION": "0",
        },
        ports[0],
        workdir / "timekeeper.log",
    )
    webhook_env = {
        "WEBHOOK_TLS_CERT_FILE": str(workdir / "tls.crt"),
        "WEBHOOK_TLS_KEY_FILE": str(workdir / "tls.key"),
        "WEBHOOK_TIMEKEEPER_URL": timekeeper.url,
        "WEBHOOK_TIMEKEEPER_TOKEN_FILE": str(workdir / "webhook-token"),
        "WEBHOOK_STATE_POLL_INTERVAL_SECONDS": "0.5",
        "WEBHOOK_STATE_POLL_RETRY_MAX_SECONDS": "0.5",
        "WEBHOOK_WATCH_PRIORITY_CLASSES": "false",  # no Kubernetes API but in the last test
    }
    webhook = WebhookProcess(webhook_env, ports[1], ca_cert, workdir / "webhook.log")
    stack = Stack(postgres, timekeeper, webhook, webhook_env, prometheus, tokens, ca_cert, workdir)
    # The first fault is there before anything runs: a roll-up that has never succeeded.
    stack.sql(ROLLUP_FAULT)
    try:
        with ThreadPoolExecutor() as starting:  # each waits for its process to answer
            for started in [starting.submit(timekeeper.start), starting.submit(webhook.start)]:
                started.result()
        wait_until(
            lambda: (stack.value("min(sum_over_time(up[1m]))") or 0) >= 3,
            what="three successful scrapes of each target",
        )
        stack.moments["quiet"] = time.time()
        yield stack
    finally:
        stack.webhook.stop()
        stack.stop_timekeeper()
        stack.client.close()


def minutes_ago(minutes: float) -> datetime:
    return datetime.now(UTC) - timedelta(minutes=minutes, seconds=5)


def admit_a_gpu_pod(stack: Stack) -> None:
    """One pod through /mutate and /validate, as the API server sends it."""
    gpu_pod = pod(container("train", {"nvidia.com/gpu": 1}), namespace="team-traffic")
    for path in ("/mutate", "/validate"):
        answer = stack.webhook.client.post(f"{stack.webhook.url}{path}", json=review(gpu_pod))
        assert answer.status_code == 200, answer.text


def test_budgets_are_scraped_only_with_the_metrics_token(stack: Stack) -> None:
    anonymous = LOCAL_HTTP.get(f"{stack.timekeeper.url}/metrics", timeout=10)
    assert anonymous.status_code == 401
    wait_until(lambda: stack.value('up{job="gpu-timekeeper"}') == 1, what="the timekeeper scraped")
    wait_until(lambda: stack.value('up{job="gpu-timekeeper-webhook"}') == 1, what="the webhook scraped")


def test_a_scheduler_job_that_never_succeeded_fires_and_resolves_once_it_does(stack: Stack) -> None:
    stack.prometheus.wait_firing("GPUTimekeeperSchedulerJobFailing", job="rollup")
    assert not [
        a
        for a in stack.prometheus.alerts("GPUTimekeeperSchedulerJobFailing")
        if a["labels"]["job"] != "rollup"
    ]

    stack.sql(ROLLUP_FIXED)

    stack.prometheus.wait_resolved("GPUTimekeeperSchedulerJobFailing")


def healthy_traffic(stack: Stack, reports: int, prefix: str) -> None:
    """Reports sidecars send, one pod each, all charged (four at a time); and an admission."""

    def send(n: int) -> None:
        pod_name = f"{prefix}-{n}"
        response = stack.report(
            namespace="team-traffic", pod=pod_name, pod_uid=pod_name, start=minutes_ago(1)
        )
        assert response.status_code in (200, 201), response.text

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(send, range(reports)))
    admit_a_gpu_pod(stack)


def test_a_burst_of_refused_reports_from_nothing_fires_ingest_errors(stack: Stack) -> None:
    for n in range(10):  # a sidecar whose token the timekeeper does not accept
        refused = stack.report("not-a-token", pod=f"lost-{n}", pod_uid=f"lost-{n}", start=minutes_ago(1))
        assert refused.status_code == 401

    stack.prometheus.wait_firing("GPUTimekeeperIngestErrors")
    # From nothing: the series was there at 0 before the burst, not born at its first refusal.
    assert stack.value('min_over_time(timekeeper_reports_total{result="rejected"}[10m])') == 0

    # Healthy traffic brings the share of refused reports over the shipped 10 minutes below 5 %.
    healthy_traffic(stack, 300, "p")
    stack.prometheus.wait_resolved("GPUTimekeeperIngestErrors")


def test_reports_held_up_by_a_locked_table_fire_ingest_slow(stack: Stack) -> None:
    """A transaction holding a lock every charge needs (a long migration, a stuck session): the reports
    that arrive meanwhile wait for it, more than 1 % of the last 10 minutes' reports take over 250 ms."""
    held = 6
    with psycopg.connect(stack.postgres.server.get_uri()) as connection:
        connection.execute("LOCK TABLE usage_totals IN EXCLUSIVE MODE")
        with ThreadPoolExecutor(max_workers=held) as pool:
            waiting = [
                pool.submit(stack.report, pod=f"held-{n}", pod_uid=f"held-{n}", start=minutes_ago(1))
                for n in range(held)
            ]
            time.sleep(1.5)
            connection.commit()
            assert all(future.result().is_success for future in waiting)

    stack.prometheus.wait_firing("GPUTimekeeperIngestSlow")

    # Fast reports bring the slow ones below 1 % of the window, leaving room for a few slowed by a busy
    # machine: 100 times (held + 4) reports in all.
    sent = stack.value("sum(increase(timekeeper_report_ingest_seconds_count[10m]))") or 0
    healthy_traffic(stack, max(0, 100 * (held + 4) - int(sent)), "q")
    stack.prometheus.wait_resolved("GPUTimekeeperIngestSlow")


H100 = "NVIDIA-H100-80GB-HBM3"


def test_a_model_budget_spent_fires_naming_the_model_and_raising_it_resolves(stack: Stack) -> None:
    """Issue #41's case: the total far from spent, the H100's own minutes gone. Before the budget test, so
    the model series are there at its busy moment."""
    total, model = 100_000, {"models": {H100: {"budget_gpu_minutes": 1}}}
    stack.admin(
        "PUT", "/namespaces/team-model/budget", {"budget_gpu_minutes": total, "period": "none", **model}
    )
    h100 = [
        {
            "uuid": "GPU-0",
            "name": "NVIDIA H100 80GB HBM3",
            "sm_util_pct": 50.0,
            "mem_used_bytes": None,
            "mem_total_bytes": None,
        }
    ]
    assert stack.report(
        namespace="team-model", pod="m", pod_uid="m", start=minutes_ago(2), minutes=2, gpus=h100
    ).is_success

    alert = stack.prometheus.wait_firing(
        "GPUTimekeeperModelBudgetExhausted", namespace="team-model", model=H100
    )
    assert H100 in alert["annotations"]["summary"]
    assert not stack.prometheus.alerts("GPUTimekeeperNamespaceBudgetExhausted")

    raised = {"models": {H100: {"budget_gpu_minutes": 1_000_000}}}
    stack.admin(
        "PUT", "/namespaces/team-model/budget", {"budget_gpu_minutes": total, "period": "none", **raised}
    )
    stack.prometheus.wait_resolved("GPUTimekeeperModelBudgetExhausted")


class _Exporter(BaseHTTPRequestHandler):
    """A stand-in timekeeper /metrics: the model budget gauges as docs/timekeeper.md shapes them, of team-a
    in the local cluster (no `cluster` label) and in member cluster `a`, its states set by the test
    (`exhausted` for those in `exhausted`, else `in_budget`)."""

    exhausted: set[tuple[str, str, str]] = set()
    MODELS = (("", "team-a", H100), ("", "team-a", "NVIDIA-A100-SXM4-80GB"), ("a", "team-a", H100))

    def do_GET(self) -> None:
        lines = ["# TYPE timekeeper_model_budget_state gauge"]
        for cluster, namespace, model in self.MODELS:
            current = "exhausted" if (cluster, namespace, model) in self.exhausted else "in_budget"
            labelled = (
                f'cluster="{cluster}",' if cluster else ""
            ) + f'namespace="{namespace}",model="{model}"'
            for state in BUDGET_STATES:
                labels = f'{labelled},state="{state}"'
                lines.append(f"timekeeper_model_budget_state{{{labels}}} {1 if state == current else 0}")
        lines.append("# TYPE timekeeper_model_budget_remaining_gpu_minutes gauge")
        for cluster, namespace, model in self.MODELS:
            remaining = 0 if (cluster, namespace, model) in self.exhausted else 380
            labels = (f'cluster="{cluster}",' if cluster else "") + f'namespace="{namespace}",model="{model}"'
            lines.append(f"timekeeper_model_budget_remaining_gpu_minutes{{{labels}}} {remaining}")
        data = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_shipped_model_alert_fires_on_the_series_the_contract_names(tmp_path: Path) -> None:
    """The shipped rule on a real Prometheus, fed the model series by a stand-in exporter with the
    ServiceMonitor's job and honor_labels: it names the namespace and the model, never the model in budget,
    and resolves when the state does. team-a of member cluster `a` is a namespace of its own: its alert
    names the cluster, and the local team-a's, which has no `cluster` label, fires apart from it."""
    binary = str(required(prometheus_binary(), "no prometheus: apt-get install prometheus"))
    _Exporter.exhausted = {("", "team-a", H100)}
    exporter = LoopbackServer(_Exporter).start()
    target = exporter.url.removeprefix("http://")
    scrape = [{"job_name": "gpu-timekeeper", "honor_labels": True, "static_configs": [{"targets": [target]}]}]
    prometheus = PrometheusProcess(tmp_path, scrape, shortened_rules())
    prometheus.start(binary)
    try:
        alert = prometheus.wait_firing("GPUTimekeeperModelBudgetExhausted", namespace="team-a", model=H100)
        assert alert["labels"]["severity"] == "warning"
        assert "cluster" not in alert["labels"]
        assert alert["annotations"]["summary"] == f"Namespace team-a has spent its {H100} GPU-minutes."
        assert len(prometheus.alerts("GPUTimekeeperModelBudgetExhausted")) == 1  # not the A100, nor a's

        _Exporter.exhausted = {("", "team-a", H100), ("a", "team-a", H100)}
        member = prometheus.wait_firing("GPUTimekeeperModelBudgetExhausted", cluster="a", namespace="team-a")
        assert (
            member["annotations"]["summary"]
            == f"Namespace team-a of cluster a has spent its {H100} GPU-minutes."
        )
        assert len(prometheus.alerts("GPUTimekeeperModelBudgetExhausted")) == 2

        _Exporter.exhausted = set()
        prometheus.wait_resolved("GPUTimekeeperModelBudgetExhausted")
    finally:
        prometheus.stop()
        exporter.stop()


def test_budget_warning_exhaustion_and_forecast_fire_and_a_grant_resolves_them(stack: Stack) -> None:
    stack.admin("PUT", "/namespaces/team-warn/budget", {"budget_gpu_minutes": 10, "period": "none"})
    stack.admin("PUT", "/namespaces/team-spent/budget", {"budget_gpu_minutes": 1, "period": "none"})
    assert stack.report(
        namespace="team-warn", pod="w", pod_uid="w", start=minutes_ago(9), minutes=9
    ).is_success
    assert stack.report(
        namespace="team-spent", pod="s", pod_uid="s", start=minutes_ago(2), minutes=2
    ).is_success

    stack.prometheus.wait_firing("GPUTimekeeperNamespaceBudgetWarning", namespace="team-warn")
    stack.prometheus.wait_firing("GPUTimekeeperNamespaceBudgetExhausted", namespace="team-spent")
    stack.prometheus.wait_firing("GPUTimekeeperNamespaceBudgetForecastExhausted", namespace="team-warn")
    stack.moments["busy"] = time.time()

    for namespace in ("team-warn", "team-spent"):
        stack.admin("POST", f"/namespaces/{namespace}/grants", {"gpu_minutes": 1_000_000, "reason": "test"})
    for name in ("Warning", "Exhausted", "ForecastExhausted"):
        stack.prometheus.wait_resolved(f"GPUTimekeeperNamespaceBudget{name}")


def test_postgresql_stopped_fires_database_down_while_the_scrape_keeps_the_budgets(stack: Stack) -> None:
    stack.admin("PUT", "/namespaces/team-outage/budget", {"budget_gpu_minutes": 42, "period": "none"})
    budget = 'max(timekeeper_namespace_budget_gpu_minutes{namespace="team-outage"})'
    wait_until(lambda: stack.value(budget) == 42, what="the budget scraped")

    stack.postgres.crash()
    try:
        stack.prometheus.wait_firing("GPUTimekeeperDatabaseDown")
        stack.prometheus.wait_firing("GPUTimekeeperNoSchedulerLeader")
        # The scrape still answers, with the last budgets read and how old they are.
        assert stack.value('up{job="gpu-timekeeper"}') == 1
        assert stack.value(budget) == 42
        age = stack.value("max(timekeeper_budget_metrics_age_seconds)")
        assert age is not None and age > 0
        assert not stack.prometheus.alerts("GPUTimekeeperDown")
    finally:
        stack.postgres.start()

    stack.prometheus.wait_resolved("GPUTimekeeperDatabaseDown")
    stack.prometheus.wait_resolved("GPUTimekeeperNoSchedulerLeader")


def test_the_timekeeper_and_the_webhook_stopped_fire_and_resolve(stack: Stack) -> None:
    stack.stop_timekeeper()
    stack.webhook.stop()
    try:
        stack.prometheus.wait_firing("GPUTimekeeperDown")
        stack.prometheus.wait_firing("GPUTimekeeperWebhookDown")
        # A webhook that starts while the timekeeper is away has never loaded the budget state.
        stack.restart_webhook()
        stack.prometheus.wait_resolved("GPUTimekeeperWebhookDown")
        stack.prometheus.wait_firing("GPUTimekeeperWebhookStateStale", pod="webhook-0")
    finally:
        stack.timekeeper.start()

    stack.prometheus.wait_resolved("GPUTimekeeperDown")
    stack.prometheus.wait_resolved("GPUTimekeeperWebhookStateStale")


def test_a_priority_class_watch_that_cannot_reach_the_api_fires(stack: Stack) -> None:
    """Resolving takes five minutes without an error (the shipped rate()'s range): not waited for."""
    kubeconfig = stack.workdir / "unreachable.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "gone", "cluster": {"server": f"https://127.0.0.1:{free_port()}"}}],
                "users": [{"name": "u", "user": {"token": "x"}}],
                "contexts": [{"name": "c", "context": {"cluster": "gone", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    stack.restart_webhook(
        WEBHOOK_WATCH_PRIORITY_CLASSES="true",
        WEBHOOK_KUBECONFIG=str(kubeconfig),
        WEBHOOK_KUBE_RETRY_MAX_SECONDS="0.5",
    )

    stack.prometheus.wait_firing("GPUTimekeeperWebhookPriorityClassWatchFailing", pod="webhook-0")


def named_metrics(expressions: list[str]) -> set[str]:
    return set().union(*(series_names(expression) for expression in expressions))


def test_every_metric_the_rules_and_the_dashboard_name_has_a_series(stack: Stack) -> None:
    panels = [target["expr"] for panel in dashboard()["panels"] for target in panel.get("targets", [])]
    named = named_metrics([alert["expr"] for alert in alerts()] + panels)
    stored = stack.prometheus.metric_names()
    assert set(NO_SERIES_HERE) <= named, "an exception for a metric nothing names"
    assert set(NO_SERIES_HERE).isdisjoint(stored), "a metric listed as having no series here has one"
    assert not named - stored - set(NO_SERIES_HERE), sorted(named - stored - set(NO_SERIES_HERE))


def test_every_dashboard_panel_shows_a_number_or_says_why_not(stack: Stack) -> None:
    """Evaluated before any traffic and again with every kind of it: never NaN; no data only where the
    panel says what that means (its noValue), and with traffic only for metrics listed in NO_SERIES_HERE,
    whose panels say they need the pod watch."""
    if "busy" not in stack.moments:
        pytest.skip("the busy moment is the budget test's: run the module whole")
    blank = []
    for panel in dashboard()["panels"]:
        expressions = [
            target["expr"].replace("$namespace", ".*").replace("$cluster", ".*")  # the variables' "All"
            for target in panel.get("targets", [])
        ]
        for moment, at in stack.moments.items():
            shown = 0
            for expression in expressions:
                values = [float(sample["value"][1]) for sample in stack.prometheus.query(expression, at)]
                assert all(value == value for value in values), (
                    f"{panel['title']!r} NaN {moment}: {expression}"
                )
                shown += len(values)
                # With traffic, every query has data but those of metrics that cannot have a series here.
                if moment == "busy" and not values and not series_names(expression) <= set(NO_SERIES_HERE):
                    blank.append((moment, panel["title"], expression))
            if expressions and not shown and "noValue" not in panel["fieldConfig"]["defaults"]:
                blank.append((moment, panel["title"], "no data, and no noValue saying why"))
        if named_metrics(expressions) & set(NO_SERIES_HERE):
            assert "pod watch" in panel["description"], panel["title"]
    assert not blank, blank


def test_every_alert_is_fired_here_or_listed_with_why_not() -> None:
    fired = set(re.findall(r'wait_firing\(\s*"(\w+)"', Path(__file__).read_text()))
    section = RUNBOOKS.read_text().split("## What the real-Prometheus test cannot cause", 1)
    assert len(section) == 2, "docs/runbooks.md lists the alerts this layer cannot cause"
    listed = set(re.findall(r"^- `(GPUTimekeeper\w+)`", section[1].split("\n## ", 1)[0], flags=re.MULTILINE))
    shipped = {alert["alert"] for alert in alerts()}
    assert fired | listed == shipped, sorted(shipped - fired - listed)
    assert not fired & listed, sorted(fired & listed)
