"""TLS settings from config: the PEM files read once, and the gRPC credentials made from them.

:meth:`TlsFiles.from_config` is ``None`` when ``security.enabled`` is false;
otherwise it reads every file at once, so a missing or unreadable one is a
:class:`~kvlease.common.config.ConfigError` naming the key and the path when a process
or client starts, never a failure at its first call.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import grpc

from kvlease.common import config as cfg
from kvlease.common.errors import KvLeaseError


@dataclass(frozen=True)
class TlsFiles:
    """PEM bytes: the CA to verify peers against, this process's certificate and key (may be empty for a client)."""

    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None
    client_auth: bool = False

    @classmethod
    def from_config(cls, config: cfg.Config, *, server: bool = False) -> "TlsFiles | None":
        """The files ``config`` names, or None if security is off. A server needs cert and key;
        under mutual TLS a client does too; every process needs the CA."""
        if not config[cfg.SECURITY_ENABLED]:
            return None
        client_auth = config[cfg.TLS_CLIENT_AUTH]
        needs_own = server or client_auth
        ca = _read(config, cfg.TLS_CA_FILE, required=True)
        cert = _read(config, cfg.TLS_CERT_FILE, required=needs_own)
        key = _read(config, cfg.TLS_KEY_FILE, required=needs_own or cert is not None)
        if cert is None and key is not None:
            raise cfg.ConfigError(f"config key {cfg.TLS_KEY_FILE.name!r} is set but "
                                  f"{cfg.TLS_CERT_FILE.name!r} is not", key=cfg.TLS_CERT_FILE.name)
        if cert is not None:
            _check_pair(config[cfg.TLS_CERT_FILE], config[cfg.TLS_KEY_FILE])
        return cls(ca, cert, key, client_auth)

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=self.client_auth)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)


def _check_pair(cert_path: str, key_path: str) -> None:
    """ConfigError unless the key file holds the private key of the certificate (gRPC would only log
    'Invalid private key' and fail every handshake, which a client retries as if the server were down)."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert_path, key_path, password=lambda: b"")
    except (ssl.SSLError, ValueError) as exc:
        raise cfg.ConfigError(f"config key {cfg.TLS_KEY_FILE.name!r}: {key_path} is not the unencrypted private key "
                              f"of the certificate {cert_path} ({exc})", key=cfg.TLS_KEY_FILE.name,
                              path=key_path) from None


def _read(config: cfg.Config, key: cfg.Key, *, required: bool) -> bytes | None:
    path = config[key]
    if not path:
        if required:
            raise cfg.ConfigError(f"security.enabled is true but config key {key.name!r} is not set "
                                  f"(env {key.env_var})", key=key.name)
        return None
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except (OSError, ValueError) as exc:  # ValueError: a path the OS cannot take (a NUL byte)
        why = getattr(exc, "strerror", None) or exc
        shown = repr(path) if "\x00" in path else path
        raise cfg.ConfigError(f"cannot read config key {key.name!r} file {shown}: {why}", key=key.name,
                              path=path) from None
    if b"-----BEGIN" not in data:
        raise cfg.ConfigError(f"config key {key.name!r}: {path} is not a PEM file", key=key.name, path=path)
    return data


def add_port(server: grpc.Server, config: cfg.Config, host_key: cfg.Key, port_key: cfg.Key,
             tls: TlsFiles | None) -> int:
    """Bind the address the two config keys give on ``server``, with TLS when ``tls`` is given; the bound
    port. KvLeaseError naming the address and the keys if it cannot (the port is taken, or the host is
    not this machine's)."""
    address = f"{config[host_key]}:{config[port_key]}"
    try:
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, tls.server_credentials())
    except RuntimeError:  # grpcio raises "Failed to bind to address ..." where older ones returned 0
        port = 0
    if port == 0:
        raise KvLeaseError(f"cannot listen on {address} (config keys {host_key.name!r}, {port_key.name!r}): "
                           "the port is in use or the host is not this machine's")
    return port
