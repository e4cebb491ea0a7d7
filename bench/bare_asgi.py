"""The baseline for HTTP figures: a bare ASGI endpoint that parses a JSON body and answers JSON, served by the
same uvicorn as the timekeeper: what the machine, server and load generator allow before our code."""

from __future__ import annotations

import json
from typing import Any

ANSWER = json.dumps({"duplicate": False, "gpu_minutes": 0.25, "state": "in_budget"}).encode()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if body:
        json.loads(body)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(ANSWER)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": ANSWER})
