"""`python -m webhook`: serve the admission webhooks over HTTPS (TLS from WEBHOOK_TLS_CERT_FILE/KEY_FILE)."""

from __future__ import annotations

import argparse

import uvicorn

from webhook.logs import configure_logging
from webhook.settings import get_settings


def main(argv: list[str] | None = None) -> None:
    settings = get_settings()
    parser = argparse.ArgumentParser(prog="python -m webhook", description=__doc__)
    parser.add_argument("--host", default=settings.host)
    parser.add_argument("--port", type=int, default=settings.port)
    parser.add_argument("--workers", type=int, default=1, help="processes; each polls the state itself")
    args = parser.parse_args(argv)
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        parser.error(
            "WEBHOOK_TLS_CERT_FILE and WEBHOOK_TLS_KEY_FILE are required: the API server speaks HTTPS only"
        )
    configure_logging(settings.log_format)
    uvicorn.run(
        "webhook.app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        ssl_certfile=str(settings.tls_cert_file),
        ssl_keyfile=str(settings.tls_key_file),
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_config=None,
        timeout_keep_alive=30,
    )


if __name__ == "__main__":
    main()
