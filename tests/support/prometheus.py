"""A real Prometheus (Debian's `prometheus` package, as promtool is) on 127.0.0.1 with a config and rules
of the test's own, scraping and evaluating twice a second; and its HTTP API as tests ask it: a query, the
alerts, the metric names it has stored, and waiting for an alert to fire or resolve."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.processes import free_port, wait_until

INTERVAL = "500ms"


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class PrometheusProcess:
    """`prometheus` with the given scrape configs and rule groups; its TSDB in `workdir`."""

    def __init__(
        self, workdir: Path, scrape_configs: list[dict[str, Any]], rule_groups: list[dict[str, Any]]
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "prometheus.log"
        (workdir / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups}))
        config = {
            "global": {
                "scrape_interval": INTERVAL,
                "scrape_timeout": INTERVAL,
                "evaluation_interval": INTERVAL,
            },
            "rule_files": [str(workdir / "rules.yaml")],
            "scrape_configs": scrape_configs,
        }
        (workdir / "prometheus.yaml").write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen[bytes] | None = None
        self.client = httpx.Client(base_url=self.url, timeout=10)

    def start(self, binary: str) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={self.workdir / 'prometheus.yaml'}",
                    f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=log,
            )
        wait_until(self._ready, timeout=30, what="prometheus to be ready")

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log_path.read_text()[-3000:]}")
        try:
            return self.client.get("/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.client.close()
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)

    def _api(self, path: str, **params: str) -> Any:
        response = self.client.get(f"/api/v1/{path}", params=params)
        body = response.json()
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expression: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's vector, now or `at` (Unix time); a scalar answers as one unlabelled sample."""
        data = self._api("query", query=expression, **({} if at is None else {"time": f"{at:.3f}"}))
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def metric_names(self) -> set[str]:
        """Every metric name with a sample stored since the start."""
        return set(self._api("label/__name__/values"))

    def alerts(self, name: str) -> list[dict[str, Any]]:
        """The named alert's pending and firing instances (a resolved one is no longer listed)."""
        return [alert for alert in self._api("alerts")["alerts"] if alert["labels"]["alertname"] == name]

    def wait_firing(self, name: str, timeout: float = 30.0, **labels: str) -> dict[str, Any]:
        """Wait until an instance of the alert with these labels fires; answers it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for alert in self.alerts(name):
                if alert["state"] == "firing" and labels.items() <= alert["labels"].items():
                    return alert
            time.sleep(0.05)
        raise AssertionError(f"{name} {labels} did not fire within {timeout}s: {self.alerts(name)}")

    def wait_resolved(self, name: str, timeout: float = 30.0) -> None:
        wait_until(lambda: not self.alerts(name), timeout=timeout, what=f"{name} to resolve")
