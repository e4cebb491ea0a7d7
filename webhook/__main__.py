"""`python -m webhook`: serve the admission webhooks over HTTPS, one stateless process per replica. uvicorn
serves HTTP with its own settings; `gpuserving.connections.GuardedHttp` adds what it has no setting for and
starts TLS, with an SSLContext the app's lifespan reloads when the certificate rotates.
`python -m webhook dev-cert` writes a throwaway CA and certificate for running it on one's own machine."""

from __future__ import annotations

import argparse
import logging
import shlex
import ssl
from pathlib import Path

import uvicorn

from gpuaccounting.logs import configure_logging
from gpuserving.connections import ConnectionLimits, GuardedHttp
from webhook.app import create_app
from webhook.settings import WebhookSettings, get_settings
from webhook.tls import generate_ca, generate_serving_cert

DEV_CERT_DIR = Path(".webhook-tls")  # in .gitignore: the certificates are made per machine, never committed


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


def write_dev_cert(directory: Path) -> dict[str, Path]:
    """A fresh CA (`ca.pem`) and the serving certificate it signs for localhost and 127.0.0.1 (`tls.crt`,
    `tls.key`), so a newcomer can start the HTTPS-only webhook locally; returns the settings naming them."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = generate_ca("gpu-timekeeper development CA")
    cert, key = generate_serving_cert(
        ca_cert, ca_key, "gpu-timekeeper-webhook", "gpu-timekeeper", extra_sans=("localhost", "127.0.0.1")
    )
    (directory / "ca.pem").write_bytes(ca_cert)
    (directory / "tls.crt").write_bytes(cert)
    key_file = directory / "tls.key"
    key_file.touch(mode=0o600)
    key_file.chmod(0o600)
    key_file.write_bytes(key)
    return {"WEBHOOK_TLS_CERT_FILE": directory / "tls.crt", "WEBHOOK_TLS_KEY_FILE": key_file}


def main(argv: list[str] | None = None) -> None:
    settings = get_settings()
    parser = argparse.ArgumentParser(prog="python -m webhook", description=__doc__)
    parser.add_argument("--host", default=settings.host)
    parser.add_argument("--port", type=int, default=settings.port)
    commands = parser.add_subparsers(dest="command")
    dev_cert = commands.add_parser("dev-cert", help="write a development CA and certificate for localhost")
    dev_cert.add_argument("--out", type=Path, default=DEV_CERT_DIR, help=f"folder (default {DEV_CERT_DIR})")
    args = parser.parse_args(argv)
    if args.command == "dev-cert":
        for name, path in write_dev_cert(args.out).items():
            print(f"export {name}={shlex.quote(str(path.resolve()))}")
        return
    try:
        built = server(settings, args.host, args.port, log_config=None)
    except ValueError as error:
        parser.error(str(error))
    configure_logging(settings.log_format)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per state poll is noise; failures are ours
    built.run()


if __name__ == "__main__":
    main()
