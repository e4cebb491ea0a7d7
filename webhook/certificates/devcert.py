"""`python -m webhook dev-cert`: a throwaway CA and serving certificate for running the HTTPS-only webhook
on one's own machine."""

from __future__ import annotations

from pathlib import Path

from webhook.certificates.tls import generate_ca, generate_serving_cert

DEV_CERT_DIR = Path(".webhook-tls")  # in .gitignore: the certificates are made per machine, never committed


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
