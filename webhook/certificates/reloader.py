"""Serve a rotated certificate without a restart: new handshakes use the new chain, open connections carry
on, and a half-written pair fails to load and is retried at the next check with the old chain kept."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from pathlib import Path

log = logging.getLogger("webhook.certificates")


class CertificateReloader:
    def __init__(self, context: ssl.SSLContext, cert_file: Path, key_file: Path) -> None:
        self.context = context
        self.cert_file = cert_file
        self.key_file = key_file
        self._seen = self._fingerprint()

    def _fingerprint(self) -> tuple[tuple[int, int], ...]:
        stats = (os.stat(self.cert_file), os.stat(self.key_file))
        return tuple((stat.st_mtime_ns, stat.st_size) for stat in stats)

    def check(self) -> bool:
        """Reload when either file changed since the last load; True when a new chain is in use."""
        try:
            current = self._fingerprint()
            if current == self._seen:
                return False
            # Try the pair on a scratch context first: a failed load into the live one can leave it
            # with the new certificate beside the old key.
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert_file, self.key_file)
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as error:
            log.warning("serving_certificate_reload_failed", extra={"error": str(error)})
            return False
        self._seen = current
        log.info("serving_certificate_reloaded", extra={"cert_file": str(self.cert_file)})
        return True

    async def run(self, interval_seconds: float) -> None:
        while True:
            await asyncio.sleep(interval_seconds)
            self.check()
