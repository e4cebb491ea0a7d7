"""The alerts and the dashboard of deployment/components/prometheus: valid for Prometheus (`promtool check
rules`), behaving as specified (`promtool test rules` on tests/deployment/prometheus/alerts.test.yaml),
each with a runbook, and naming only metrics the code exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from tests.deployment.conftest import DEPLOYMENT, ROOT, required
from tests.test_docs import _anchors
from timekeeper.metrics import Metrics, PodWatchCollector
from timekeeper.periodic.runner import PeriodicCollector
from webhook.metrics import WebhookMetrics

COMPONENT = DEPLOYMENT / "components" / "prometheus"
UNIT_TESTS = Path(__file__).parent / "prometheus" / "alerts.test.yaml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
RUNBOOK_URL = "https://github.com/gpu-timekeeper/gpu-timekeeper/blob/main/docs/runbooks.md#"
# Series Prometheus makes itself for every target.
SYNTHETIC = {"up"}
# Names in PromQL that are not series: keywords and the label names of grouping clauses are removed before.
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
}


def rule_groups() -> list[dict[str, Any]]:
    return yaml.safe_load((COMPONENT / "prometheusrule.yaml").read_text())["spec"]["groups"]


def alerts() -> list[dict[str, Any]]:
    return [rule for group in rule_groups() for rule in group["rules"] if "alert" in rule]


def dashboard() -> dict[str, Any]:
    return json.loads((COMPONENT / "dashboard.json").read_text())


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = required(shutil.which("promtool"), "no promtool: apt-get install prometheus (.ci/run does)")
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120, check=False)


def exported_metric_names() -> set[str]:
    """Every series name the timekeeper's and the webhook's /metrics can expose, from their registries."""
    registries = [Metrics().registry, WebhookMetrics(state_age=lambda: None).registry]
    scheduler = CollectorRegistry()
    scheduler.register(
        PeriodicCollector(SimpleNamespace(replica="tk-0:1", leading=True, health={}, counts={}))  # type: ignore[arg-type]
    )
    scheduler.register(PodWatchCollector())  # the reconciler's, registered with the scheduler's
    registries.append(scheduler)
    return {
        family.name + suffix
        for registry in registries
        for family in registry.collect()
        for suffix in SUFFIXES[family.type]
    }


def series_names(expression: str) -> set[str]:
    """The metric names a PromQL expression selects (a small lexer: Prometheus ships no parser for Python)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expression)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers, and Grafana's ${variables}
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\blabel_values\(\s*([a-zA-Z_:][\w:]*)\s*,[^)]*\)", r"\1", text)  # Grafana's
    names = set()
    for match in re.finditer(r"(?<![\w.$])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        if not match.group(2) and match.group(1) not in KEYWORDS:
            names.add(match.group(1))
    return names


def dashboard_expressions() -> list[str]:
    board = dashboard()
    expressions = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    expressions += [v["definition"] for v in board["templating"]["list"] if v["type"] == "query"]
    return expressions


def test_promtool_accepts_the_rules(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups()}))
    done = promtool("check", "rules", str(rules))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in rule_groups())} rules found" in done.stdout


def test_every_alert_behaves_as_its_unit_test_says(tmp_path):
    groups = yaml.safe_load(yaml.safe_dump(rule_groups()))
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)  # promtool compares annotations whole; check rules validates them
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    done = promtool("test", "rules", str(tmp_path / UNIT_TESTS.name))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test_that_fires_it():
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert {alert["alert"] for alert in alerts()} == fired


def test_every_alert_has_a_severity_a_summary_and_a_runbook_section():
    sections = _anchors(RUNBOOKS)
    for alert in alerts():
        assert alert["labels"]["severity"] in {"info", "warning", "critical"}
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
        anchor = alert["annotations"]["runbook_url"].removeprefix(RUNBOOK_URL)
        assert anchor == alert["alert"].lower() and anchor in sections, alert["alert"]


def test_every_runbook_section_is_an_alert():
    text = re.sub(r"```.*?```", "", RUNBOOKS.read_text(), flags=re.DOTALL)
    headings = set(re.findall(r"^## (GPUTimekeeper\w+)$", text, flags=re.MULTILINE))
    assert headings == {alert["alert"] for alert in alerts()}


def test_the_lexer_finds_the_series_of_an_expression():
    expression = (
        'sum by (job) (increase(timekeeper_job_runs_total{outcome="error"}[15m])) > 0 '
        'unless on (job) max(up{job="x"} offset 5m) and label_values(webhook_state_version, pod)'
    )
    assert series_names(expression) == {"timekeeper_job_runs_total", "up", "webhook_state_version"}


@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_every_metric_named_is_one_the_code_exports(source):
    expressions = [alert["expr"] for alert in alerts()] if source == "alerts" else dashboard_expressions()
    named = set().union(*(series_names(expression) for expression in expressions))
    assert named, "no metric found: the lexer is broken"
    unknown = named - exported_metric_names() - SYNTHETIC
    assert not unknown, f"the {source} name metrics no code exports: {sorted(unknown)}"


def test_the_dashboard_covers_budgets_ingest_admission_state_and_the_scheduler():
    board = dashboard()
    assert board["uid"] == "gpu-timekeeper"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    named = set().union(*(series_names(e) for e in dashboard_expressions()))
    for metric in (
        "timekeeper_namespace_used_gpu_minutes",
        "timekeeper_namespace_budget_gpu_minutes",
        "timekeeper_namespace_burn_rate_gpu_minutes_per_hour",
        "timekeeper_namespace_forecast_exhaustion_seconds",
        "timekeeper_model_budget_remaining_gpu_minutes",
        "timekeeper_model_budget_state",
        "timekeeper_silent_gpu_pods",
        "timekeeper_reports_total",
        "timekeeper_report_ingest_seconds_bucket",
        "webhook_admissions_total",
        "webhook_admission_duration_seconds_bucket",
        "webhook_state_age_seconds",
        "timekeeper_scheduler_leader",
        "timekeeper_job_runs_total",
    ):
        assert metric in named
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"], panel["title"]


def test_the_dashboards_panels_fit_the_grid_without_overlapping():
    """Panels are placed by hand (gridPos): one moved onto another hides it in Grafana."""
    boxes = []
    for panel in dashboard()["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        boxes.append((panel["title"], grid["x"], grid["y"], grid["x"] + grid["w"], grid["y"] + grid["h"]))
    for n, (title, left, top, right, bottom) in enumerate(boxes):
        for other, o_left, o_top, o_right, o_bottom in boxes[n + 1 :]:
            overlap = left < o_right and o_left < right and top < o_bottom and o_top < bottom
            assert not overlap, f"{title!r} overlaps {other!r}"
