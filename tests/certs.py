"""Throwaway certificates for the TLS tests: a CA, a server cert for 127.0.0.1/localhost,
and a client cert, written as PEM files (made with `cryptography`)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Certs:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str  # a CA that signed nothing here


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject, key, issuer, issuer_key, ca: bool, sans=()):
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _write(path: Path, *items) -> str:
    data = b""
    for item in items:
        if isinstance(item, x509.Certificate):
            data += item.public_bytes(serialization.Encoding.PEM)
        else:
            data += item.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
    path.write_bytes(data)
    return str(path)


def make_certs(directory: Path) -> Certs:
    directory = Path(directory)
    ca_key, other_key, server_key, client_key = _key(), _key(), _key(), _key()
    ca = _cert("lineage test CA", ca_key, "lineage test CA", ca_key, ca=True)
    other = _cert("other CA", other_key, "other CA", other_key, ca=True)
    sans = (x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    server = _cert("localhost", server_key, "lineage test CA", ca_key, ca=False, sans=sans)
    client = _cert("a client", client_key, "lineage test CA", ca_key, ca=False)
    return Certs(
        ca=_write(directory / "ca.pem", ca),
        server_cert=_write(directory / "server.pem", server),
        server_key=_write(directory / "server.key", server_key),
        client_cert=_write(directory / "client.pem", client),
        client_key=_write(directory / "client.key", client_key),
        other_ca=_write(directory / "other-ca.pem", other),
    )
