"""Many ZooKeeper reads in few requests: ZooKeeper's multiRead (ZooKeeper 3.6+; kvlease needs 3.8).

A failover reads thousands of small nodes (at 1,000 partitions: 4,000 snapshot listings and as many
handles). Through kazoo each read is a request of its own, ~150-200 us of this process's CPU (its
future, its wake-up of the connection thread, a poll and a send, a poll and a receive): most of a
reinitialization. ``multiRead`` carries up to :data:`BATCH` getData / getChildren operations in one
request and answers each on its own (a missing node is that operation's NoNodeError, not the
request's). It travels through kazoo's own connection (:meth:`KazooClient._call`, as kazoo's
``get_async`` does), so the session, its chroot and its authentication are the client's.
"""

from __future__ import annotations

import struct
from collections import namedtuple

from kazoo.client import KazooClient
from kazoo.exceptions import EXCEPTIONS
from kazoo.protocol.serialization import GetChildren, GetData, read_buffer, read_string, stat_struct, write_string
from kazoo.protocol.states import ZnodeStat

#: Operations per request (a listing or a small node each: responses of tens to hundreds of KB).
BATCH = 128

DATA, CHILDREN = GetData.type, GetChildren.type
_HEADER = struct.Struct("!iBi")  # MultiHeader: type, done, err
_INT = struct.Struct("!i")


class MultiRead(namedtuple("MultiRead", "ops")):
    """``ops``: (DATA or CHILDREN, chrooted path) each. Its answer: per operation (data, ZnodeStat), the
    children's names, or the operation's error (an exception instance, not raised)."""

    type = 22  # ZooKeeper's OpCode.multiRead

    def serialize(self) -> bytearray:
        b = bytearray()
        for kind, path in self.ops:
            b += _HEADER.pack(kind, 0, -1)
            b += write_string(path)
            b.append(0)  # no watch
        b += _HEADER.pack(-1, 1, -1)
        return b

    @classmethod
    def deserialize(cls, buffer, offset: int) -> list:
        results: list = []
        while True:
            kind, done, err = _HEADER.unpack_from(buffer, offset)
            offset += _HEADER.size
            if done:
                return results
            if kind == DATA:
                data, offset = read_buffer(buffer, offset)
                results.append((data, ZnodeStat._make(stat_struct.unpack_from(buffer, offset))))
                offset += stat_struct.size
            elif kind == CHILDREN:
                count = _INT.unpack_from(buffer, offset)[0]
                offset += _INT.size
                children = []
                for _ in range(max(count, 0)):
                    child, offset = read_string(buffer, offset)
                    children.append(child)
                results.append(children)
            else:  # an error result: its code
                code = _INT.unpack_from(buffer, offset)[0]
                offset += _INT.size
                results.append(EXCEPTIONS[code]())


class Reads:
    """Reads asked at once (batched, pipelined) and waited for in :meth:`results`."""

    def __init__(self, zk: KazooClient, ops: list[tuple[int, str]], batch: int = BATCH) -> None:
        root = zk.chroot or ""
        self._pending = []
        for start in range(0, len(ops), batch):
            chunk = [(kind, root + path) for kind, path in ops[start:start + batch]]
            result = zk.handler.async_result()
            zk._call(MultiRead(chunk), result)  # as kazoo's own get_async does
            self._pending.append((len(chunk), result))

    def results(self) -> list:
        """Per operation, in order: (data, stat), children, or its error (an exception instance). Raises what
        failed a whole request (the connection lost, the session expired)."""
        out: list = []
        for count, result in self._pending:
            answers = result.get()
            if len(answers) != count:
                raise RuntimeError(f"multiRead answered {len(answers)} of {count} operations")
            out.extend(answers)
        return out


def read_many(zk: KazooClient, ops: list[tuple[int, str]], batch: int = BATCH) -> list:
    """:class:`Reads` of ``ops`` ((DATA or CHILDREN, path) each), waited for."""
    return Reads(zk, ops, batch).results()
