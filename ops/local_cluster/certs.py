"""Throwaway certificates for a local cluster: a CA, a node certificate, a client certificate.

:func:`generate` writes PEM files into a directory (keys readable by the owner
only): ``ca.pem``, ``node.pem``/``node-key.pem`` (every coordinator and tablet
server; it also authenticates them to each other under mutual TLS) and
``client.pem``/``client-key.pem`` (the CLI and other clients). Each
certificate names ``127.0.0.1`` and ``localhost``. Not for production: the CA
key is kept beside the certificates so that more can be issued.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class CertPaths:
    ca: Path
    node_cert: Path
    node_key: Path
    client_cert: Path
    client_key: Path


def generate(directory: str | os.PathLike[str], *, hosts: tuple[str, ...] = HOSTS, days: int = 365,
             now: dt.datetime | None = None, node_name: str = "kvlease", client_name: str = "kvlease-client") -> CertPaths:
    """Write a fresh CA and node and client certificates signed by it into ``directory``.

    The node certificate's common name is ``node_name``: under mutual TLS it
    authenticates as that user, so it is the cluster's own principal
    (``security.internal.username``, default ``kvlease``)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = now or dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvlease local CA")])
    ca_cert = (_builder(ca_name, ca_name, ca_key.public_key(), now, days)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    paths = CertPaths(out / "ca.pem", out / "node.pem", out / "node-key.pem", out / "client.pem", out / "client-key.pem")
    _write(paths.ca, ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(out / "ca-key.pem", _key_pem(ca_key), private=True)
    for cn, cert_path, key_path in ((node_name, paths.node_cert, paths.node_key),
                                    (client_name, paths.client_cert, paths.client_key)):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (_builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]), ca_name, key.public_key(), now, days)
                .add_extension(x509.SubjectAlternativeName(_san(hosts)), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        _write(key_path, _key_pem(key), private=True)
    return paths


def _builder(subject: x509.Name, issuer: x509.Name, public_key, now: dt.datetime, days: int) -> x509.CertificateBuilder:
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days)))


def _san(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
