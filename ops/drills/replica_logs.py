"""The tablet-failover drill's own reader of every replica's changelog, from the tablet servers' data dirs.

A bucket's changelog is ``<tablet home>/data/<table id>/<bucket>/log/{base offset:020d}.log``: framed
entries back to back (common/logentry.py, docs/changelog.md). The files are read while the servers run,
read-only; a frame still being written at a segment's end is left out. Each entry is kept with its frame
bytes (its fingerprint: replicas append entries byte for byte) and its records decoded with ``id`` as key
and ``v`` as value (:class:`~kvlease.ops.drills.failover_checks.ChangeRecord`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from kvlease.client.log_records import decode_records, entry_records
from kvlease.common.codec import RowCodec
from kvlease.common.logentry import ChangeType, CorruptLogError, LogEntry, decode_entry, read_header
from kvlease.ops.drills.failover_checks import ChangeRecord


@dataclass(frozen=True)
class Frame:
    """One changelog entry of one replica: decoded, and its bytes as written."""

    entry: LogEntry
    data: bytes


ReplicaLogs = dict[str, dict[int, list[Frame]]]  # "tablet 2" -> bucket -> frames in offset order


def read_replica_logs(tablets: Iterable[dict[str, Any]], table_id: int) -> ReplicaLogs:
    """Every replica's frames of table ``table_id``, per tablet server of ``tablets`` (cluster.json entries)."""
    logs: ReplicaLogs = {}
    for tablet in tablets:
        data = Path(tablet["log"]).parent / "data" / str(table_id)
        for bucket_dir in sorted(data.iterdir()) if data.is_dir() else ():
            frames: list[Frame] = []
            for segment in sorted((bucket_dir / "log").glob("*.log")):
                frames += frames_of(segment.read_bytes())
            logs.setdefault(f"tablet {tablet['id']}", {})[int(bucket_dir.name)] = frames
    return logs


def log_starts(tablets: Iterable[dict[str, Any]], table_id: int) -> dict[str, dict[int, int]]:
    """Every replica's first changelog offset of table ``table_id`` (its first segment's base offset; 0 when
    it has none), per tablet server of ``tablets``: above 0 for a replica rebuilt from a snapshot."""
    starts: dict[str, dict[int, int]] = {}
    for tablet in tablets:
        data = Path(tablet["log"]).parent / "data" / str(table_id)
        for bucket_dir in sorted(data.iterdir()) if data.is_dir() else ():
            segments = sorted((bucket_dir / "log").glob("*.log"))
            starts.setdefault(f"tablet {tablet['id']}", {})[int(bucket_dir.name)] = (
                int(segments[0].stem) if segments else 0)
    return starts


def frames_of(buf: bytes) -> list[Frame]:
    """The complete frames of one segment file's bytes, in order (a torn or unwritten tail left out)."""
    frames, pos = [], 0
    while pos < len(buf):
        try:
            header = read_header(buf, pos, len(buf))
        except CorruptLogError:
            break
        end = pos + header.size + header.payload_len
        if end > len(buf):
            break
        data = buf[pos:end]
        try:
            frames.append(Frame(decode_entry(data), data))
        except CorruptLogError:
            break  # a frame whose payload is not all written yet
        pos = end
    return frames


def fingerprints(frames: Iterable[Frame], below: int) -> list[tuple[int, bytes]]:
    """``(base offset, frame bytes)`` of the frames wholly below offset ``below``."""
    return [(f.entry.base_offset, f.data) for f in frames if f.entry.next_offset <= below]


def describe_frame(data: bytes) -> str:
    """A frame's header in words, for a report: its leader epoch and writer batch."""
    try:
        header = read_header(data, 0, len(data))
    except CorruptLogError:
        return "a damaged entry"
    writer = f", writer {header.writer_id} batch {header.sequence}" if header.writer_id >= 0 else ""
    return f"an entry of leader epoch {header.leader_epoch}{writer}"


def change_records(codec: RowCodec, frames: Iterable[Frame], below: int,
                   decoded: dict[bytes, list[ChangeRecord]] | None = None) -> list[ChangeRecord]:
    """The records below offset ``below``, ``id`` as key and ``v`` as value (None where a record has none).
    ``decoded``: frame bytes -> their records, filled and reused (replicas hold the same frames: each is
    decoded once)."""
    decoded = {} if decoded is None else decoded
    out: list[ChangeRecord] = []
    for frame in frames:
        records = decoded.get(frame.data)
        if records is None:
            batch = decode_records(codec, entry_records(frame.entry)).to_pylist()
            records = decoded[frame.data] = [
                ChangeRecord(r["offset"], ChangeType(r["change_type"]).short, r["id"], r.get("v")) for r in batch]
        out += [r for r in records if r.offset < below]
    return out
