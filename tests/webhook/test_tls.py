"""The TLS helper: a CA and a serving certificate for `<svc>.<ns>.svc` that a TLS client accepts."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from webhook.certificates.tls import generate_ca, generate_serving_cert


def test_serving_cert_names_every_service_form_plus_extras() -> None:
    ca_cert, ca_key = generate_ca("test CA")
    cert_pem, _ = generate_serving_cert(
        ca_cert, ca_key, "hook", "gpu-timekeeper", extra_sans=("localhost", "127.0.0.1")
    )
    certificate = x509.load_pem_x509_certificate(cert_pem)
    sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "hook",
        "hook.gpu-timekeeper",
        "hook.gpu-timekeeper.svc",
        "hook.gpu-timekeeper.svc.cluster.local",
        "localhost",
    ]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert certificate.issuer == x509.load_pem_x509_certificate(ca_cert).subject


def _handshake(tmp_path: Path, ca_cert: bytes, cert: bytes, key: bytes, server_name: str) -> str:
    (tmp_path / "ca.pem").write_bytes(ca_cert)
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept() -> None:
        connection, _ = listener.accept()
        with server_context.wrap_socket(connection, server_side=True) as tls:
            tls.sendall(b"ok")

    thread = threading.Thread(target=accept)
    thread.start()
    client_context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        client_context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        received = tls.recv(2).decode()
    thread.join()
    listener.close()
    return received


def test_a_verifying_client_accepts_the_service_name(tmp_path: Path) -> None:
    ca_cert, ca_key = generate_ca("test CA")
    cert, key = generate_serving_cert(ca_cert, ca_key, "hook", "gpu-timekeeper")
    assert _handshake(tmp_path, ca_cert, cert, key, "hook.gpu-timekeeper.svc") == "ok"


def test_an_rsa_ca_from_elsewhere_can_sign(tmp_path: Path) -> None:
    import datetime

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rsa CA")])
    now = datetime.datetime.now(datetime.UTC)
    ca = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    cert, serving_key = generate_serving_cert(ca_pem, key_pem, "hook", "ns")
    assert _handshake(tmp_path, ca_pem, cert, serving_key, "hook.ns.svc") == "ok"
