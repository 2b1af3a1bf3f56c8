"""Which data dir each tablet server id last registered with: a wiped or replaced disk is a new dir.

A tablet server keeps ``server.json`` ``{server_id, dir_id}`` in its data dir
(created with a new uuid when absent) and registers ``dir_id`` in its
``/tabletservers/ids/{id}`` node. The coordinator records the dir id it saw
per server id in ``/tabletservers/dirs/{id}`` (persistent, written fenced in
the same multi-op as the assignment changes it causes). A server id seen for
the first time is just recorded; one registering with another dir id than
recorded lost the data of every replica placed on it
(:func:`kvlease.coordinator.data_loss_plan.servers_lost`). A registration without a dir id
(an older tablet server) is never taken for a loss.
"""

from __future__ import annotations

import logging
from typing import Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from kvlease.common import zkpaths
from kvlease.common.zk import ZkOp, dumps, loads
from kvlease.coordinator.data_loss_plan import new_dir_reason

log = logging.getLogger(__name__)


class DataDirs:
    def __init__(self) -> None:
        self.by_server: dict[int, str] = {}  # server id -> the dir id recorded

    def load(self, zk: KazooClient) -> None:
        zk.ensure_path(zkpaths.TABLET_DIRS)
        self.by_server = {}
        names = [n for n in zk.get_children(zkpaths.TABLET_DIRS) if n.isdigit()]
        for name, result in [(n, zk.get_async(zkpaths.tablet_dir(n))) for n in names]:
            try:
                dir_id = (loads(result.get()[0]) or {}).get("dir_id")
            except NoNodeError:
                continue
            if dir_id:
                self.by_server[int(name)] = str(dir_id)

    def lost(self, registered: Mapping[int, str]) -> dict[int, str]:
        """The servers (id -> reason) whose registered dir id (``registered``: id -> dir id, "" if none)
        differs from the one recorded."""
        return {sid: new_dir_reason(sid) for sid, dir_id in sorted(registered.items())
                if dir_id and self.by_server.get(sid) not in (None, dir_id)}

    def ops(self, registered: Mapping[int, str]) -> list[ZkOp]:
        """The writes that record ``registered``'s dir ids (none for those already recorded)."""
        ops = []
        for sid, dir_id in sorted(registered.items()):
            if not dir_id or self.by_server.get(sid) == dir_id:
                continue
            verb = "set" if sid in self.by_server else "create"
            ops.append(ZkOp(verb, zkpaths.tablet_dir(sid), dumps({"dir_id": dir_id})))
        return ops

    def recorded(self, registered: Mapping[int, str]) -> None:
        """Apply what :meth:`ops` wrote."""
        for sid, dir_id in registered.items():
            if dir_id and self.by_server.get(sid) != dir_id:
                if sid in self.by_server:
                    log.warning("tablet server %d registered with a new data dir %s (was %s)", sid, dir_id,
                                self.by_server[sid])
                self.by_server[sid] = dir_id
