"""`python -m webhook`: serve the admission webhooks over HTTPS (TLS from WEBHOOK_TLS_CERT_FILE/KEY_FILE).

One process per replica (replicas are stateless; scale with the Deployment). The server's SSLContext is
handed to the app, whose lifespan reloads a rotated certificate into it. The connection limits uvicorn
has no setting for come from `webhook.connections`.
"""

from __future__ import annotations

import argparse
import logging

import uvicorn

from gpuaccounting.logs import configure_logging
from webhook.app import create_app
from webhook.connections import ConnectionLimits, WebhookServer, guarded_protocol
from webhook.settings import WebhookSettings, get_settings


def server(settings: WebhookSettings, host: str, port: int, **options: object) -> uvicorn.Server:
    """A uvicorn server for the app with TLS from the settings' files."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        raise ValueError(
            "WEBHOOK_TLS_CERT_FILE and WEBHOOK_TLS_KEY_FILE are required: the API server speaks HTTPS only"
        )
    app = create_app(settings)
    limits = ConnectionLimits(
        max_connections=settings.max_connections,
        max_header_bytes=settings.max_header_bytes,
        request_timeout_seconds=settings.request_timeout_seconds,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_certfile=str(settings.tls_cert_file),
        ssl_keyfile=str(settings.tls_key_file),
        loop="none",  # WebhookServer.run brings its own
        http=guarded_protocol(limits, app.state.metrics.refused),
        access_log=False,
        # The API server calls the webhook directly and nothing here reads a client address: no
        # X-Forwarded-* middleware around every admission.
        proxy_headers=False,
        timeout_keep_alive=settings.keep_alive_timeout_seconds,
        lifespan="on",
        **options,  # type: ignore[arg-type]
    )
    config.load()
    app.state.ssl_context = config.ssl
    return WebhookServer(config, tls_timeout=settings.request_timeout_seconds)


def main(argv: list[str] | None = None) -> None:
    settings = get_settings()
    parser = argparse.ArgumentParser(prog="python -m webhook", description=__doc__)
    parser.add_argument("--host", default=settings.host)
    parser.add_argument("--port", type=int, default=settings.port)
    args = parser.parse_args(argv)
    try:
        built = server(settings, args.host, args.port, log_config=None)
    except ValueError as error:
        parser.error(str(error))
    configure_logging(settings.log_format)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per state poll is noise; failures are ours
    built.run()


if __name__ == "__main__":
    main()
