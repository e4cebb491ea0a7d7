"""`python -m webhook`: serve the admission webhooks over HTTPS, one stateless process per replica. uvicorn
serves HTTP with its own settings; `httpguard.connections.GuardedHttp` adds what it has no setting for and
starts TLS, with an SSLContext the app's lifespan reloads when the certificate rotates.
`python -m webhook dev-cert` writes a throwaway CA and certificate for running it on one's own machine."""

from __future__ import annotations

import argparse
import logging
import shlex
from pathlib import Path

from gpuaccounting.logs import configure_logging
from webhook.certificates.devcert import DEV_CERT_DIR, write_dev_cert
from webhook.serving.server import server
from webhook.settings import get_settings


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
