"""Secure against plain in one benchmark run: what turns security on for a benchmark's cluster.

:func:`secure_setup` writes a throwaway CA and certificates, picks the
cluster's password, adds the user ``bench`` (a real scrypt record) and its
grants in the benchmark's ZooKeeper chroot, and returns the settings: every
server process's, the measured client's (user ``bench``: TLS + password, every
call authenticated and authorized by ACL, not a super user) and the setup
client's (the cluster's own principal, which may commit snapshots).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from kvlease.common import config as cfg
from kvlease.common.security.acl import Operation, Resource
from kvlease.common.security.acl_store import AclStore
from kvlease.common.security.users import UserStore
from kvlease.common.zk import make_client
from kvlease.ops.local_cluster import client_settings, generate_certs, server_settings

BENCH_USER = "bench"


@dataclass(frozen=True)
class SecureSetup:
    server: dict[str, Any]  # config values of every server process
    client: cfg.Config  # the measured client: user bench
    setup_client: cfg.Config  # the cluster's own principal


def secure_setup(directory: Path, zk_values: Mapping[str, Any],
                 grants: Iterable[tuple[Operation, Resource]]) -> SecureSetup:
    """Certificates in ``directory/certs``; user ``bench`` with ``grants`` in the chroot ``zk_values`` name."""
    paths = generate_certs(directory / "certs")
    cluster_password, user_password = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    server = server_settings(paths, cluster_password, client_auth=False)
    zk = make_client(cfg.Config(dict(zk_values), env={}))
    try:
        UserStore(zk).add(BENCH_USER, user_password)
        acls = AclStore(zk)
        for operation, resource in grants:
            acls.add(resource, f"User:{BENCH_USER}", operation)
    finally:
        zk.stop()
        zk.close()
    client = cfg.Config(client_settings(paths, BENCH_USER, user_password), env={})
    setup_client = cfg.Config(client_settings(paths, "kvlease", cluster_password), env={})
    return SecureSetup(server, client, setup_client)
