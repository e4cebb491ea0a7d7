"""A stand-in for the API server's TokenReview endpoint: answers for the tokens a test registers, as a
kube-apiserver answers for a pod-bound projected token (ServiceAccount username, pod-name and pod-uid
extras), only when the requested audience is the token's and the caller presents the agent's token."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from tests.support.loopback import LoopbackServer, send_json


@dataclass
class TokenReviewServer:
    caller_token: str
    audience: str
    # token -> (namespace, pod name, pod uid)
    tokens: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    reviews: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: LoopbackServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def start(self) -> TokenReviewServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True  # headers and body in two writes: no delayed-ACK stall

            def do_POST(self) -> None:
                if self.path != "/apis/authentication.k8s.io/v1/tokenreviews":
                    send_json(self, 404, {"kind": "Status", "code": 404})
                    return
                if self.headers.get("Authorization") != f"Bearer {fake.caller_token}":
                    send_json(self, 401, {"kind": "Status", "code": 401})
                    return
                review = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                with fake.lock:
                    fake.reviews += 1
                spec = review["spec"]
                owner = fake.tokens.get(spec["token"])
                status: dict[str, object] = {"authenticated": False}
                if owner is not None and fake.audience in spec.get("audiences", []):
                    namespace, pod, uid = owner
                    status = {
                        "authenticated": True,
                        "audiences": [fake.audience],
                        "user": {
                            "username": f"system:serviceaccount:{namespace}:default",
                            "uid": "sa-uid",
                            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                            "extra": {
                                "authentication.kubernetes.io/pod-name": [pod],
                                "authentication.kubernetes.io/pod-uid": [uid],
                            },
                        },
                    }
                send_json(self, 201, {**review, "status": status})

            def log_message(self, format: str, *args: object) -> None:
                return None

        self.server = LoopbackServer(Handler).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
