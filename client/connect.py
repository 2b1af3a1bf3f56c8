"""One entry point for a library user: :func:`connect` finds a cluster, and its security settings, as the CLI does.

Where the cluster is, first match wins: ``connect(cluster=DIR)`` or ``connect(bootstrap="h:p,h:p")`` (one of
them, not both), then ``KVLEASE_BOOTSTRAP``, then ``KVLEASE_CLUSTER``: the CLI's order (``--bootstrap``,
``--cluster``, then the same two variables).

The client config, in layers (each overrides the one before): the environment (``KVLEASE_<KEY>`` of every
config key, e.g. ``KVLEASE_CLIENT_REQUEST_TIMEOUT``); a cluster directory's security settings (a ``kvlease
cluster start --secure`` cluster: its CA, client certificate and ``admin`` credentials, the credentials left
out when a user is named); the TLS files (``ca_file=`` etc., else ``KVLEASE_CA_FILE``, ``KVLEASE_CERT_FILE``,
``KVLEASE_KEY_FILE``), which turn TLS on; then ``user=`` with its password (``password=``, ``password_file=``,
else ``KVLEASE_PASSWORD_FILE``, else ``KVLEASE_SECURITY_PASSWORD``). A password is never sent without TLS.
:func:`layered_config` is the part the CLI shares.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.client.admin import AdminClient, parse_bootstrap
from kvlease.client.cluster_dir import (check_running, cluster_dir_bootstrap, cluster_dir_security, read_cluster_file,
                                       read_password_file)

if TYPE_CHECKING:  # imported by Connection.table(): Arrow and pandas only for a command that reads or writes rows
    from kvlease.client.table import TableClient

ENV_BOOTSTRAP = "KVLEASE_BOOTSTRAP"
ENV_CLUSTER = "KVLEASE_CLUSTER"
ENV_RETRY_TIMEOUT = "KVLEASE_RETRY_TIMEOUT"
ENV_PASSWORD_FILE = "KVLEASE_PASSWORD_FILE"
#: The CLI's ``--ca-file``/``--cert-file``/``--key-file`` variables -> their config keys.
ENV_TLS_FILES = {"KVLEASE_CA_FILE": cfg.TLS_CA_FILE, "KVLEASE_CERT_FILE": cfg.TLS_CERT_FILE,
                 "KVLEASE_KEY_FILE": cfg.TLS_KEY_FILE}
_CREDENTIALS = (cfg.SECURITY_USERNAME.name, cfg.SECURITY_PASSWORD.name)


def layered_config(env: Mapping[str, str], cluster_settings: Mapping[str, Any] | None = None,
                   tls_files: Mapping[str, str] | None = None, *, user_named: bool = False) -> cfg.Config:
    """The environment's config, then ``cluster_settings`` (a cluster directory's security keys; without its
    credentials when ``user_named`` or ``KVLEASE_SECURITY_USERNAME`` names a user), then ``tls_files`` (config
    key -> path; any turns TLS on). The credentials of a named user are the caller's to add."""
    config = cfg.Config(env=env)
    if cluster_settings:
        if user_named or config[cfg.SECURITY_USERNAME]:
            cluster_settings = {k: v for k, v in cluster_settings.items() if k not in _CREDENTIALS}
        config = config.with_overrides(cluster_settings)
    tls_files = {k: v for k, v in (tls_files or {}).items() if v}
    if tls_files:
        config = config.with_overrides({cfg.SECURITY_ENABLED.name: True, **tls_files})
    return config


def find_cluster(cluster: str | os.PathLike[str] | None = None, bootstrap: str | list[str] | None = None,
                 env: Mapping[str, str] | None = None) -> tuple[list[str], str | None]:
    """``(coordinator addresses, the cluster directory or None)`` by the module's order; InvalidRequestError
    for both given, neither found, a directory without a cluster, or a malformed address, and its
    ClusterNotRunningError for a directory whose cluster is stopped (none of its recorded processes runs)."""
    env = os.environ if env is None else env
    if cluster is not None and bootstrap is not None:
        raise errors.InvalidRequestError("connect(): give cluster=DIR or bootstrap='HOST:PORT,…', not both")
    if cluster is None and bootstrap is None:
        bootstrap = env.get(ENV_BOOTSTRAP) or None
        cluster = None if bootstrap else env.get(ENV_CLUSTER) or None
    if bootstrap is not None:
        if isinstance(bootstrap, (str, os.PathLike)) and os.path.isdir(bootstrap):
            raise errors.InvalidRequestError(f"bootstrap={errors.show(str(bootstrap))} is a directory: "
                                             f"use connect(cluster={str(bootstrap)!r}) for a cluster directory")
        return parse_bootstrap(bootstrap), None
    if cluster is None:
        raise errors.InvalidRequestError(
            f"connect(): no cluster given: connect(cluster=DIR) or connect(bootstrap='HOST:PORT,…'), "
            f"or set {ENV_CLUSTER} or {ENV_BOOTSTRAP}")
    directory = os.fspath(cluster)
    if not os.path.isdir(directory):
        hint = f"; for coordinator addresses use connect(bootstrap={directory!r})" if _is_addresses(directory) else ""
        raise errors.InvalidRequestError(f"cluster={errors.show(directory)}: no such directory{hint}")
    check_running(directory, read_cluster_file(directory))
    return cluster_dir_bootstrap(directory), directory


def _is_addresses(text: str) -> bool:
    try:
        parse_bootstrap(text)
    except errors.InvalidRequestError:
        return False
    return True


class Connection:
    """A cluster: ``.admin`` (an :class:`~kvlease.client.admin.AdminClient`) and ``.table(name)``; thread-safe.

    Close it (or use ``with``) to close the admin client and every table client it made.
    """

    def __init__(self, addresses: list[str], config: cfg.Config, retry_total_s: float,
                 cluster: str | None = None) -> None:
        """Use :func:`connect` instead; this takes what it resolved."""
        self.config = config
        self.cluster = cluster  # the cluster directory, when the addresses came from one
        self.retry_total_s = retry_total_s
        self.admin = AdminClient(addresses, config, retry_total_s=retry_total_s)
        self._tables: list[TableClient] = []

    @property
    def addresses(self) -> list[str]:
        """The coordinator addresses it was given."""
        return self.admin.bootstrap

    def table(self, name: str | int) -> TableClient:
        """A :class:`~kvlease.client.table.TableClient` of table ``DB.NAME`` (or a table id), closed with this
        connection; TableNotExistError if there is none."""
        from kvlease.client.table import TableClient

        client = TableClient(self.admin, name, self.config, retry_total_s=self.retry_total_s)
        self._tables.append(client)
        return client

    def close(self) -> None:
        """Close the table clients it made and the admin client (idempotent)."""
        for client in self._tables:
            client.close()
        self.admin.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = f"cluster={self.cluster!r}" if self.cluster else f"bootstrap={','.join(self.addresses)!r}"
        return f"Connection({where})"


def connect(cluster: str | os.PathLike[str] | None = None, bootstrap: str | list[str] | None = None, *,
            ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None,
            user: str | None = None, password: str | None = None, password_file: str | None = None,
            retry_timeout: str | float | None = None, options: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None) -> Connection:
    """A :class:`Connection` to the cluster in directory ``cluster`` or at coordinators ``bootstrap``.

    With neither, ``KVLEASE_BOOTSTRAP`` or ``KVLEASE_CLUSTER`` says where (see the module doc for the order
    and the security settings). ``retry_timeout``: how long a call retries an unreachable cluster, a duration
    (``"10s"``) or seconds; default ``KVLEASE_RETRY_TIMEOUT``, else ``client.retry.total-timeout`` (60s).
    ``options``: further config keys (``{"client.request-timeout": "5s"}``). ``env`` replaces ``os.environ``.
    Nothing is sent until the first call. Bad input is InvalidRequestError (ConfigError for a bad value); a
    ``cluster`` directory whose processes all stopped is ClusterNotRunningError at once.
    """
    env = os.environ if env is None else env
    addresses, directory = find_cluster(cluster, bootstrap, env)
    tls_files = {key.name: env.get(var) for var, key in ENV_TLS_FILES.items()}
    tls_files.update({k: v for k, v in ((cfg.TLS_CA_FILE.name, ca_file), (cfg.TLS_CERT_FILE.name, cert_file),
                                        (cfg.TLS_KEY_FILE.name, key_file)) if v})
    settings = cluster_dir_security(directory) if directory else None
    config = layered_config(env, settings, tls_files, user_named=bool(user))
    if options:
        config = config.with_overrides(options)
    if user or password or password_file:
        config = config.with_overrides(_credentials(config, user, password, password_file, env))
    return Connection(addresses, config, _retry_s(retry_timeout, env, config), directory)


def _credentials(config: cfg.Config, user: str | None, password: str | None, password_file: str | None,
                 env: Mapping[str, str]) -> dict[str, str]:
    """``user`` and its password as config keys; a password only with TLS on."""
    if not config[cfg.SECURITY_ENABLED]:
        raise errors.InvalidRequestError("connect(user=…, password…) needs TLS (ca_file=…, or the cluster= of a "
                                         "secure cluster): a password is never sent in the clear")
    user = user or config[cfg.SECURITY_USERNAME]
    if not user:
        raise errors.InvalidRequestError("connect(): a password needs user=NAME (or KVLEASE_SECURITY_USERNAME)")
    if password is None:
        password_file = password_file or env.get(ENV_PASSWORD_FILE)
        password = read_password_file(password_file) if password_file else env.get(cfg.SECURITY_PASSWORD.env_var)
    if not password:
        raise errors.InvalidRequestError(f"connect(user={user!r}): no password: give password= or password_file= "
                                         f"(or set {ENV_PASSWORD_FILE} or {cfg.SECURITY_PASSWORD.env_var})")
    return {cfg.SECURITY_USERNAME.name: user, cfg.SECURITY_PASSWORD.name: password}


def _retry_s(retry_timeout: str | float | None, env: Mapping[str, str], config: cfg.Config) -> float:
    value = retry_timeout if retry_timeout is not None else env.get(ENV_RETRY_TIMEOUT)
    if value is None:
        return config[cfg.CLIENT_RETRY_TOTAL] / 1000.0
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    try:
        return cfg.parse_duration_ms(value) / 1000.0
    except ValueError as exc:
        where = "retry_timeout" if retry_timeout is not None else ENV_RETRY_TIMEOUT
        raise errors.InvalidRequestError(f"{where}: {exc}") from None
