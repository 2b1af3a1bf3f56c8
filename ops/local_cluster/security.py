"""What ``kvlease cluster start --secure`` adds to a local cluster: TLS, the cluster's secrets and an admin.

:func:`prepare` makes (or reuses) in the cluster directory ``D``:

```
D/certs/            a throwaway CA, the nodes' and the clients' certificates (ops.local_cluster.certs)
D/secrets.json      (0600) the cluster's own password (security.internal.password) and the
                    ZooKeeper digest identity (security.zookeeper.digest): the same in every process
D/admin.password    (0600) the password of the super user ``admin``
```

and gives the config keys every coordinator and tablet server gets (mutual
TLS, security on, those secrets, ``security.super-users = User:admin``) and
cluster.json's ``security`` section, which names the client certificate and
the admin's credentials file, so that ``kvlease --cluster D …`` connects with
TLS and authenticates as ``admin`` on its own
(:func:`kvlease.client.cluster_dir.security_settings`). Secrets are reused when the
directory has them already: a restarted cluster keeps its ZooKeeper data, whose
nodes only the old digest identity may change.

:func:`create_admin` writes the ``admin`` user straight into ZooKeeper (the
cluster's processes are not serving yet, so no one can call the SecurityService).

:func:`server_settings` and :func:`client_settings` are the one builder of
security config keys: this launcher, the benchmarks and the tests' secure
clusters all take theirs from it.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any, Mapping

from kvlease.common import config as cfg
from kvlease.ops.local_cluster.certs import CertPaths

ADMIN = "admin"
ADMIN_PASSWORD_FILE = "admin.password"
SECRETS_FILE = "secrets.json"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by the owner only (also when the file existed with wider rights)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _secret() -> str:
    return secrets.token_urlsafe(24)


def _cluster_secrets(directory: Path) -> dict[str, str]:
    path = directory / SECRETS_FILE
    try:
        found = json.loads(path.read_text())
        if found.get("internal_password") and found.get("zookeeper_digest"):
            return found
    except (OSError, ValueError):
        pass
    made = {"internal_password": _secret(), "zookeeper_digest": f"kvlease:{_secret()}"}
    write_private(path, json.dumps(made) + "\n")
    return made


def admin_password(directory: Path) -> str:
    """The admin's password from ``D/admin.password``, made (random) if there is none yet."""
    path = directory / ADMIN_PASSWORD_FILE
    try:
        password = path.read_text().strip()
    except OSError:
        password = ""
    if not password:
        password = _secret()
        write_private(path, password + "\n")
    return password


def server_settings(paths: CertPaths, internal_password: str, *, client_auth: bool = True,
                    super_users: str | None = None, zk_digest: str | None = None) -> dict[str, Any]:
    """The security config keys of every coordinator and tablet server: security on, TLS with the node
    certificate of ``paths``, the cluster's own password; mutual TLS with ``client_auth``; optionally the
    super users and the ZooKeeper digest identity."""
    settings: dict[str, Any] = {
        cfg.SECURITY_ENABLED.name: True, cfg.TLS_CA_FILE.name: str(paths.ca),
        cfg.TLS_CERT_FILE.name: str(paths.node_cert), cfg.TLS_KEY_FILE.name: str(paths.node_key),
        cfg.TLS_CLIENT_AUTH.name: client_auth, cfg.INTERNAL_PASSWORD.name: internal_password}
    if zk_digest is not None:
        settings[cfg.ZK_DIGEST.name] = zk_digest
    if super_users is not None:
        settings[cfg.SUPER_USERS.name] = super_users
    return settings


def client_settings(paths: CertPaths, username: str | None = None, password: str | None = None, *,
                    certificate: bool = False) -> dict[str, Any]:
    """A client's security config keys: TLS trusting the CA of ``paths``; with ``username`` its password;
    with ``certificate`` the client certificate of ``paths`` (for servers that want mutual TLS)."""
    settings: dict[str, Any] = {cfg.SECURITY_ENABLED.name: True, cfg.TLS_CA_FILE.name: str(paths.ca)}
    if certificate:
        settings.update({cfg.TLS_CERT_FILE.name: str(paths.client_cert), cfg.TLS_KEY_FILE.name: str(paths.client_key)})
    if username is not None:
        settings.update({cfg.SECURITY_USERNAME.name: username, cfg.SECURITY_PASSWORD.name: password})
    return settings


def prepare(directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(config keys of every cluster process, cluster.json's "security")`` for a secure cluster in ``directory``."""
    import kvlease.ops.local_cluster.certs as certs

    paths = certs.generate(directory / "certs")
    made = _cluster_secrets(directory)
    admin_password(directory)
    overrides = server_settings(paths, made["internal_password"], client_auth=True, super_users=f"User:{ADMIN}",
                                zk_digest=made["zookeeper_digest"])
    doc = {"ca_file": str(paths.ca), "cert_file": str(paths.client_cert), "key_file": str(paths.client_key),
           "client_auth": True, "username": ADMIN, "password_file": str(directory / ADMIN_PASSWORD_FILE)}
    return overrides, doc


def create_admin(directory: Path, zk_connect: str, zk_root: str, overrides: Mapping[str, Any]) -> None:
    """Add (or re-password) the ``admin`` user in the cluster's ZooKeeper, before its processes serve."""
    from kvlease.common.errors import AlreadyExistsError
    from kvlease.common.security.users import UserStore
    from kvlease.common.zk import make_client

    settings = {cfg.ZK_ADDRESS.name: zk_connect, cfg.ZK_ROOT.name: zk_root,
                cfg.ZK_DIGEST.name: overrides[cfg.ZK_DIGEST.name]}
    zk = make_client(cfg.Config(settings, env={}))
    try:
        users = UserStore(zk)
        password = admin_password(directory)
        try:
            users.add(ADMIN, password)
        except AlreadyExistsError:  # a restarted cluster: the file's password is the one that counts
            users.set_password(ADMIN, password)
    finally:
        zk.stop()
        zk.close()
