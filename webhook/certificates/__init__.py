"""Certificates: the serving certificate made (`tls`, `python -m webhook dev-cert`), kept in Secrets
(`python -m webhook.certbootstrap`) and reloaded when it rotates."""
