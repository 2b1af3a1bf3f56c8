"""ZooKeeper digest ACLs on kvlease's nodes (``security.zookeeper.digest``).

With a digest ``user:password`` configured, every client authenticates as the
ZooKeeper identity ``digest:user:<sha1>`` and every node it creates carries
one ACL entry: that identity, all permissions. Nobody else can read, create,
change or delete a node, or change an ACL: reads are closed too, because
``/security/users`` holds password hashes and ``/security/acls`` who may do
what (kvlease's clients never read ZooKeeper; they ask a coordinator).

The chroot node's ACL says whose the tree is. :func:`check_access` runs once a
client has connected:

- the chroot is ours (our identity has every permission): fine;
- the chroot is open (``world:anyone`` may administer it) and we have a
  digest: the tree was made before the digest was configured, so we put our
  ACL on every node under it, the chroot last (an interrupted pass is
  repeated by the next process that starts);
- the chroot is open and we have no digest: fine (security off);
- otherwise (ZooKeeper refuses to show the ACL, or it names another
  identity): :class:`~kvlease.common.config.ConfigError` naming the key.
"""

from __future__ import annotations

import logging

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError
from kazoo.security import ACL, Id, Permissions, make_digest_acl, make_digest_acl_credential

from kvlease.common import config as cfg

log = logging.getLogger(__name__)

_WORLD = Id("world", "anyone")
_HINT = f"check {cfg.ZK_DIGEST.name} (it must be the same in every kvlease process and admin tool)"


def digest_identity(config: cfg.Config) -> tuple[str, str] | None:
    """``(user, password)`` of ``security.zookeeper.digest``, or None when it is empty."""
    value = config[cfg.ZK_DIGEST]
    if not value:
        return None
    user, _, password = value.partition(":")
    return user, password


def auth_data(config: cfg.Config) -> list[tuple[str, str]] | None:
    """KazooClient's ``auth_data``: the digest credentials, or None."""
    identity = digest_identity(config)
    return [("digest", f"{identity[0]}:{identity[1]}")] if identity else None


def node_acl(config: cfg.Config) -> list[ACL] | None:
    """The ACL of every node kvlease creates: the digest identity may do everything, nobody else anything.
    None (ZooKeeper's open ACL) when no digest is configured."""
    identity = digest_identity(config)
    return [make_digest_acl(identity[0], identity[1], all=True)] if identity else None


def _refused(root: str, what: str) -> cfg.ConfigError:
    return cfg.ConfigError(f"ZooKeeper refused {what} {root or '/'}: {_HINT}", key=cfg.ZK_DIGEST.name)


def ensure_chroot(bootstrap: KazooClient, root: str, acl: list[ACL] | None) -> None:
    """Create the chroot node (with ``acl``) if missing; its parents get ZooKeeper's open ACL."""
    parent = root.rsplit("/", 1)[0]
    if parent:
        bootstrap.ensure_path(parent)
    try:
        if not bootstrap.exists(root):
            bootstrap.create(root, acl=acl)
    except NodeExistsError:  # another process made it meanwhile
        pass
    except NoAuthError:
        raise _refused(parent or "/", "to create the chroot under") from None


def check_access(client: KazooClient, config: cfg.Config, root: str) -> None:
    """Make sure ``client`` (started, on the chroot) may change the tree; secure an open tree with our ACL.

    Raises ConfigError (naming ``security.zookeeper.digest``) when the tree belongs to another identity.
    """
    identity = digest_identity(config)
    try:
        acls, _ = client.get_acls("/")
    except NoAuthError:
        raise _refused(root, "to read the ACL of") from None
    mine = Id("digest", make_digest_acl_credential(*identity)) if identity else None
    if mine is not None and any(a.id == mine and a.perms & Permissions.ALL == Permissions.ALL for a in acls):
        return
    if any(a.id == _WORLD and a.perms & Permissions.ADMIN for a in acls):
        if identity is not None and root:  # no chroot: never re-ACL ZooKeeper's own root
            secure_tree(client, node_acl(config))
        return
    raise _refused(root, "access to")


def secure_tree(client: KazooClient, acl: list[ACL]) -> int:
    """Set ``acl`` on every node of ``client``'s chroot, children before parents (the chroot last).

    Returns how many nodes were changed; a node deleted meanwhile is skipped.
    """
    order: list[str] = []
    pending = ["/"]
    while pending:
        path = pending.pop()
        order.append(path)
        try:
            children = client.get_children(path)
        except NoNodeError:
            continue
        pending.extend(f"{path.rstrip('/')}/{name}" for name in children)
    log.info("securing %d existing ZooKeeper nodes with the %s ACL", len(order), cfg.ZK_DIGEST.name)
    changed = 0
    for path in reversed(order):  # parents were listed before their children
        try:
            client.set_acls(path, acl)
            changed += 1
        except NoNodeError:
            pass
    return changed
