"""The baseline for HTTP figures: a bare ASGI endpoint that reads and parses a JSON body and answers JSON.

Served by the same uvicorn as the timekeeper, it shows what the machine, the server and the load generator
allow before any of our code runs.
"""

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
