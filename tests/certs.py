"""A throwaway CA with server and client certificates (PEM files), for TLS listener tests."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Certs:
    ca: Path  # the CA certificate (clients' ssl.ca.location, the broker's truststore)
    server: Path  # key + chain in one file (the broker's ssl.keystore.location)
    server_cert: Path
    server_key: Path
    client_cert: Path  # signed by the CA: mTLS
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: "untrusted server certificate"
    encrypted_server: Path  # key (encrypted with KEY_PASSWORD) + chain
    localhost_only: Path  # key + a certificate naming localhost but not 127.0.0.1


KEY_PASSWORD = "keystore-pw"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kcli tests"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, issuer_key: ec.EllipticCurvePrivateKey,
          ca: bool = False, sans: list[x509.GeneralName] | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey, password: str | None = None) -> bytes:
    enc = (serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)


def make_certs(root: Path) -> Certs:
    root.mkdir(parents=True, exist_ok=True)
    ca_key, other_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(4))
    ca = _cert("kcli test CA", ca_key, "kcli test CA", ca_key, ca=True)
    other = _cert("another CA", other_key, "another CA", other_key, ca=True)
    server = _cert("localhost", server_key, "kcli test CA", ca_key,
                   sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    client = _cert("kcli-client", client_key, "kcli test CA", ca_key)
    by_name = _cert("localhost", server_key, "kcli test CA", ca_key, sans=[x509.DNSName("localhost")])
    files = {
        "ca.pem": _pem(ca), "other-ca.pem": _pem(other),
        "server.pem": _key_pem(server_key) + _pem(server) + _pem(ca),
        "server-encrypted.pem": _key_pem(server_key, KEY_PASSWORD) + _pem(server) + _pem(ca),
        "server.crt": _pem(server) + _pem(ca), "server.key": _key_pem(server_key),
        "client.crt": _pem(client), "client.key": _key_pem(client_key),
        "localhost-only.pem": _key_pem(server_key) + _pem(by_name) + _pem(ca),
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
        (root / name).chmod(0o600)
    return Certs(root / "ca.pem", root / "server.pem", root / "server.crt", root / "server.key",
                 root / "client.crt", root / "client.key", root / "other-ca.pem", root / "server-encrypted.pem", root / "localhost-only.pem")
