"""A rotated serving certificate is picked up by the running server, without a restart."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path

import httpx
import pytest

from tests.support.admission_state_server import run_state_server, snapshot
from tests.webhook.conftest import Tls, serve_webhook
from webhook.certificates.reloader import CertificateReloader
from webhook.certificates.tls import generate_ca, generate_serving_cert


def _fetch_healthz(url: str, ca_file: Path) -> bool:
    """True when a client trusting only `ca_file` completes a handshake and gets an answer."""
    try:
        with httpx.Client(verify=ssl.create_default_context(cafile=str(ca_file)), timeout=5) as client:
            return client.get(f"{url}/healthz").status_code == 200
    except httpx.ConnectError:
        return False


def test_rotated_certificate_is_served_to_new_connections(tls: Tls, tmp_path: Path) -> None:
    own = Tls(tmp_path / "ca.pem", tmp_path / "tls.crt", tmp_path / "tls.key")
    for source, target in (
        (tls.ca_file, own.ca_file),
        (tls.cert_file, own.cert_file),
        (tls.key_file, own.key_file),
    ):
        shutil.copy(source, target)
    new_ca, new_ca_key = generate_ca("rotated CA")
    new_cert, new_key = generate_serving_cert(new_ca, new_ca_key, "svc", "ns", extra_sans=("localhost",))
    (tmp_path / "new-ca.pem").write_bytes(new_ca)
    with (
        run_state_server(snapshot()) as state,
        serve_webhook(own, state, tls_reload_interval_seconds=0.05) as hook,
    ):
        assert _fetch_healthz(hook.url, own.ca_file)
        assert not _fetch_healthz(hook.url, tmp_path / "new-ca.pem")
        own.key_file.write_bytes(new_key)
        own.cert_file.write_bytes(new_cert)
        hook.wait_until(lambda: _fetch_healthz(hook.url, tmp_path / "new-ca.pem"))
        assert not _fetch_healthz(hook.url, own.ca_file)


def _handshakes(server_context: ssl.SSLContext, ca_file: Path) -> bool:
    """An in-memory TLS handshake between the server context and a client trusting only `ca_file`."""
    client_context = ssl.create_default_context(cafile=str(ca_file))
    client_in, client_out, server_in, server_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_context.wrap_bio(client_in, client_out, server_hostname="localhost")
    server = server_context.wrap_bio(server_in, server_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for name, end in (("client", client), ("server", server)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError:
                    return False
        server_in.write(client_out.read())
        client_in.write(server_out.read())
        if all(done.values()):
            return True
    return False


@pytest.mark.parametrize("written_first", ["key", "certificate"])
def test_a_half_written_pair_keeps_the_old_certificate(tls: Tls, tmp_path: Path, written_first: str) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(tls.cert_file, cert)
    shutil.copy(tls.key_file, key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    reloader = CertificateReloader(context, cert, key)
    assert reloader.check() is False  # unchanged
    ca, ca_key = generate_ca("other")
    new_cert, new_key = generate_serving_cert(ca, ca_key, "svc", "ns", extra_sans=("localhost",))
    if written_first == "key":
        key.write_bytes(new_key)
    else:
        cert.write_bytes(new_cert)
    assert reloader.check() is False
    assert _handshakes(context, tls.ca_file)  # still serving the old pair
    cert.write_bytes(new_cert)
    key.write_bytes(new_key)
    assert reloader.check() is True
    (tmp_path / "other-ca.pem").write_bytes(ca)
    assert _handshakes(context, tmp_path / "other-ca.pem") and not _handshakes(context, tls.ca_file)
