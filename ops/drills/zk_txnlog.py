"""Read ZooKeeper's transaction logs: every committed write, its zxid and the session that made it.

A drill uses them to see *who* wrote what (a ZooKeeper node's stat only says
when): ``dataDir/version-2/log.<zxid>`` files, as ZooKeeper 3.x writes them
(``FileTxnLog``)::

    header:  "ZKLG" (4 bytes), format version (int), dbid (long)
    records: crc (long, Adler-32 of the txn bytes), length (int), txn bytes, 'B'
    txn:     TxnHeader {clientId long, cxid int, zxid long, time long, type int}, then the record

All integers are big-endian (jute). A record of length 0 (the log is
preallocated with zeros) or a torn / bad-checksum record ends a file. Only
the leading path (and a version) of each record is decoded; what follows it
(data, ACLs, the digest) is skipped, so new trailing fields do not matter.
Inside a multi-op every sub-operation is reported; a multi-op ZooKeeper
rejected was logged with error records (type -1) in place of its operations,
so it shows no write.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

MAGIC = b"ZKLG"
HEADER = struct.Struct(">4sIq")
RECORD = struct.Struct(">qi")
TXN_HEADER = struct.Struct(">qiqqi")
END_OF_RECORD = 0x42

# ZooDefs.OpCode values that change the tree, by the kind reported
CREATE_TYPES = {1: "create", 15: "create", 19: "create", 21: "create"}  # create, create2, container, ttl
OP_KINDS = {**CREATE_TYPES, 2: "delete", 5: "set", 13: "check"}
MULTI = 14
ERROR = -1


@dataclass(frozen=True)
class ZkOp:
    """One operation of a committed transaction (a multi-op has several)."""

    kind: str  # create | delete | set | check
    path: str
    version: int | None = None  # set: the node's new version; check: the version it required


@dataclass(frozen=True)
class Txn:
    zxid: int
    session: int
    time_ms: int
    multi: bool
    ops: tuple[ZkOp, ...]  # the tree-changing operations (and checks) it carried; () for others


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def int(self) -> int:
        (value,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return value

    def buffer(self) -> bytes:
        length = self.int()
        if length < 0:
            return b""
        value = self.data[self.pos:self.pos + length]
        if len(value) != length:
            raise ValueError("truncated buffer")
        self.pos += length
        return value

    def string(self) -> str:
        return self.buffer().decode("utf-8", errors="replace")


def _op(kind_type: int, body: bytes) -> ZkOp | None:
    kind = OP_KINDS.get(kind_type)
    if kind is None:
        return None
    reader = _Reader(body)
    path = reader.string()
    version = None
    if kind == "check":
        version = reader.int() - 1  # logged as the version the node would have after an increment
    elif kind == "set":
        reader.buffer()  # the data
        version = reader.int()
    return ZkOp(kind, path, version)


def parse_txn(data: bytes) -> Txn:
    """One transaction's bytes (TxnHeader + record)."""
    session, _cxid, zxid, time_ms, kind = TXN_HEADER.unpack_from(data, 0)
    body = data[TXN_HEADER.size:]
    ops: list[ZkOp] = []
    if kind == MULTI:
        reader = _Reader(body)
        for _ in range(reader.int()):
            sub_type = reader.int()
            op = _op(sub_type, reader.buffer())
            if op is not None:
                ops.append(op)
    else:
        op = _op(kind, body)
        if op is not None:
            ops.append(op)
    return Txn(zxid, session, time_ms, kind == MULTI, tuple(ops))


def parse_log(data: bytes) -> Iterator[Txn]:
    """The transactions of one log file's bytes, up to its end (zeros) or a torn record."""
    if len(data) < HEADER.size or data[:4] != MAGIC:
        raise ValueError("not a ZooKeeper transaction log (no ZKLG header)")
    pos = HEADER.size
    while pos + RECORD.size <= len(data):
        crc, length = RECORD.unpack_from(data, pos)
        start = pos + RECORD.size
        if length <= 0 or start + length + 1 > len(data):
            return
        txn = data[start:start + length]
        if zlib.adler32(txn) != crc & 0xFFFFFFFF or data[start + length] != END_OF_RECORD:
            return  # torn by a crash, or being written right now
        yield parse_txn(txn)
        pos = start + length + 1


def log_files(data_dirs: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Every ``log.*`` file under each ``dataDir`` (its ``version-2``), oldest first per directory."""
    files: list[Path] = []
    for data_dir in data_dirs:
        version_dir = Path(data_dir) / "version-2"
        found = [p for p in version_dir.glob("log.*") if p.is_file()] if version_dir.is_dir() else []
        files.extend(sorted(found, key=lambda p: int(p.name.split(".", 1)[1], 16)))
    return files


def read_txns(data_dirs: Iterable[str | os.PathLike[str]], since_zxid: int = 0) -> list[Txn]:
    """The committed transactions in the logs of these ZooKeeper nodes, merged by zxid.

    Nodes of one ensemble log the same transactions under the same zxids;
    each zxid is kept once, so a node that missed some (it was down) is
    covered by the others.
    """
    by_zxid: dict[int, Txn] = {}
    for path in log_files(data_dirs):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        for txn in parse_log(data):
            if txn.zxid >= since_zxid:
                by_zxid.setdefault(txn.zxid, txn)
    return [by_zxid[zxid] for zxid in sorted(by_zxid)]
