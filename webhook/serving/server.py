"""The HTTPS server of `python -m webhook`: uvicorn serves HTTP with its own settings;
`httpguard.connections.GuardedHttp` adds what it has no setting for and starts TLS, with an SSLContext the
app's lifespan reloads when the certificate rotates."""

from __future__ import annotations

import logging
import ssl

import uvicorn

from httpguard.connections import ConnectionLimits, GuardedHttp
from webhook.serving.app import create_app
from webhook.settings import WebhookSettings


class _HttpsInStartedMessage(logging.Filter):
    """uvicorn names its scheme from `Config.ssl`, which stays None here because `GuardedHttp` starts TLS
    itself: correct the scheme in uvicorn's "running on" line rather than tell a newcomer to call http://."""

    def filter(self, record: logging.LogRecord) -> bool:
        message, args = record.msg, record.args
        if (
            isinstance(message, str)
            and message.startswith("Uvicorn running on %s://")
            and isinstance(args, tuple)
        ):
            record.args = ("https", *args[1:])
        return True


_HTTPS_IN_STARTED_MESSAGE = _HttpsInStartedMessage()


def server(settings: WebhookSettings, host: str, port: int, **options: object) -> uvicorn.Server:
    """A uvicorn server for the app with TLS from the settings' files."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        raise ValueError(
            "WEBHOOK_TLS_CERT_FILE and WEBHOOK_TLS_KEY_FILE are required: the API server speaks HTTPS only"
        )
    app = create_app(settings)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    refused = app.state.metrics.refused

    def count_refusal(reason: str) -> None:
        refused.labels(reason=reason).inc()

    limits = ConnectionLimits(
        max_connections=settings.max_connections,
        max_connections_per_source=settings.max_connections_per_source,
        max_head_bytes=settings.max_header_bytes,
        head_timeout_seconds=settings.head_timeout_seconds,
        body_timeout_seconds=settings.body_timeout_seconds,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="asyncio",  # whose transports honour pause_reading in connection_made (uvloop's do not)
        http=GuardedHttp(limits, "httptools", tls=context, on_refused=count_refusal),  # type: ignore[arg-type]
        ws="none",
        access_log=False,
        # The API server calls the webhook directly and nothing here reads a client address: no
        # X-Forwarded-* middleware around every admission.
        proxy_headers=False,
        timeout_keep_alive=settings.keep_alive_timeout_seconds,
        lifespan="on",
        **options,  # type: ignore[arg-type]
    )
    app.state.ssl_context = context
    logging.getLogger("uvicorn.error").addFilter(_HTTPS_IN_STARTED_MESSAGE)  # added once, however often
    return uvicorn.Server(config)
