"""A stand-in for the timekeeper's report endpoint, for the sidecar's own tests (the end-to-end test uses
the real timekeeper): records every request and answers with scripted statuses, then 200."""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from gpuaccounting.names import CLUSTER_HEADER, REPORTS_PATH
from tests.support.loopback import LoopbackServer, send_json


@dataclass
class Received:
    path: str
    authorization: str | None
    body: dict[str, Any]
    status: int
    cluster: str | None = None  # the fleet's CLUSTER_HEADER, when sent


@dataclass
class ReportReceiver:
    """Answers `script` statuses in order (then 200 with an ack); `requests` records everything."""

    script: deque[int] = field(default_factory=deque)
    requests: list[Received] = field(default_factory=list)
    seen: set[tuple[str, int]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: LoopbackServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def accepted(self) -> list[dict[str, Any]]:
        """Bodies answered 2xx, first delivery of each (pod_uid, seq) only, in arrival order."""
        with self.lock:
            return [r.body for r in self.requests if r.status == 200 and not r.body.get("_duplicate")]

    def start(self) -> ReportReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True  # headers and body in two writes: no delayed-ACK stall

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with receiver.lock:
                    status = receiver.script.popleft() if receiver.script else 200
                    key = (body.get("pod_uid"), body.get("seq"))
                    duplicate = status == 200 and key in receiver.seen
                    if status == 200:
                        receiver.seen.add(key)
                    body["_duplicate"] = duplicate
                    receiver.requests.append(
                        Received(
                            self.path,
                            self.headers.get("Authorization"),
                            body,
                            status,
                            self.headers.get(CLUSTER_HEADER),
                        )
                    )
                if self.path != REPORTS_PATH:
                    status = 404
                payload = (
                    {"duplicate": duplicate, "gpu_minutes": 0.0, "state": "in_budget"}
                    if status == 200
                    else {"detail": f"scripted {status}"}
                )
                send_json(self, status, payload)

            def log_message(self, format: str, *args: object) -> None:
                return None

        self.server = LoopbackServer(Handler).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
