"""Scan batches built from a real RocksDB iterator and put on the wire by hand (tablet/scan/batch.py,
tablet/scan/wire.py), read back without copies (client/scan_wire.py): byte for byte what pyarrow and
protobuf make, the budget and row cap kept, and the same batch again from the same place (a replay)."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from rocksdict import Options, Rdict

from kvlease.client import scan_wire as client_wire
from kvlease.common.codec import ipc_to_batch
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.tablet.scan import batch as scan_batch
from kvlease.tablet.scan import wire as scan_wire
from kvlease.tablet.scan.batch import IPC_OVERHEAD, ROW_OVERHEAD


@pytest.fixture
def db(tmp_path):
    """A raw-mode RocksDB with 5,000 rows of 1..300 random bytes (a few of 0 bytes), key order = index."""
    rng = random.Random(7)
    db = Rdict(str(tmp_path / "db"), Options(raw_mode=True))
    rows = {}
    for i in range(5000):
        value = rng.randbytes(rng.choice([0, 1, 5, 40, 300]))
        rows[i.to_bytes(4, "big")] = value
        db[i.to_bytes(4, "big")] = value
    db.flush()
    yield db, rows
    db.close()


def read_all(db, budget, max_rows=None):
    it = db.iter()
    it.seek_to_first()
    batches = []
    while True:
        batch = scan_batch.read_batch(it, budget, max_rows)
        batches.append(batch)
        if not batch.has_more:
            return batches


@pytest.mark.parametrize("budget", [1, 100, 4096, 70_000, 1 << 30])
def test_batches_cover_every_row_once_within_the_budget(db, budget):
    db, rows = db
    batches = read_all(db, budget)
    values = [v for b in batches for v in b.values()]
    assert values == list(rows.values())
    for b in batches:
        assert b.count >= 1 and b.offsets.dtype == np.int32 and b.offsets[0] == 0
        assert b.data_size + ROW_OVERHEAD * b.count <= budget or b.count == 1  # one row beyond the budget alone
    assert [b.last_key for b in batches[:-1]] == [list(rows)[i - 1] for i in np.cumsum([b.count for b in batches])[:-1]]


def test_row_cap_and_same_place_same_batch(db):
    db, rows = db
    it = db.iter()
    it.seek_to_first()
    first = scan_batch.read_batch(it, 10_000, max_rows=7)
    assert first.count == 7 and not first.has_more  # the cap reached: no more for this call
    again = scan_batch.read_batch(it, 10_000)
    it.seek(first.last_key + b"\x00")
    replay = scan_batch.read_batch(it, 10_000)  # a replay: the same rows, buffers and flags
    assert replay.values() == again.values() and replay.last_key == again.last_key
    assert scan_wire.answer(replay, scanner_id=b"s").data == scan_wire.answer(again, scanner_id=b"s").data
    tail = scan_batch.read_batch(it, 1 << 30)  # the rest: the end of the snapshot
    assert not tail.has_more and not it.valid() and tail.last_key == list(rows)[-1]
    assert scan_batch.read_batch(it, 100).count == 0


@pytest.fixture
def keyed_db(tmp_path):
    """Like ``db`` but each value starts with its 4-byte key (as a stored row holds its primary key)."""
    rng = random.Random(11)
    db = Rdict(str(tmp_path / "keyed"), Options(raw_mode=True))
    for i in range(5000):
        key = i.to_bytes(4, "big")
        db[key] = key + rng.randbytes(rng.choice([0, 1, 5, 40, 300]))
    db.flush()
    yield db
    db.close()


def reader_and_read_batch(db, start, budget, caps, key_of):
    """The batches a ValueReader and read_batch make from ``start``, call by call (``caps`` cycled)."""
    reader = scan_batch.ValueReader(key_of, start)
    values, it, plain = db.values(from_key=start), db.iter(), db.iter()
    plain.seek(start)
    pairs = []
    for call in range(100_000):
        cap = caps[call % len(caps)]
        ours, theirs = reader.read(values, it, budget, cap), scan_batch.read_batch(plain, budget, cap)
        pairs.append((ours, theirs))
        if not theirs.count:
            return reader, pairs
    raise AssertionError("no end")


@pytest.mark.parametrize("budget", [1, 100, 4096, 70_000, 1 << 30])
@pytest.mark.parametrize("start", [b"", (1234).to_bytes(4, "big") + b"\x00"])
def test_a_value_reader_makes_the_batches_read_batch_makes(keyed_db, budget, start):
    reader, pairs = reader_and_read_batch(keyed_db, start, budget, [None, 7, 1, None, 300], lambda v: v[:4])
    assert sum(theirs.count for _, theirs in pairs) == 5000 - (1235 if start else 0)
    for ours, theirs in pairs:
        assert (ours.values(), ours.last_key, ours.has_more) == (theirs.values(), theirs.last_key, theirs.has_more)
        assert scan_wire.answer(ours, scanner_id=b"s").data == scan_wire.answer(theirs, scanner_id=b"s").data
    assert reader.key_misses == 0 and len(reader.pending) == 0


@pytest.mark.parametrize("key_of", [lambda v: bytes(4), lambda v: v[:4] + b"x", lambda v: v[4:], lambda v: 1 / 0],
                         ids=["a key with another value", "a key not there", "garbage", "raises"])
def test_a_value_reader_finds_the_last_key_by_stepping_when_key_of_is_wrong(keyed_db, key_of):
    reader, pairs = reader_and_read_batch(keyed_db, b"", 3000, [None, 7], key_of)
    for ours, theirs in pairs:
        assert (ours.values(), ours.last_key, ours.has_more) == (theirs.values(), theirs.last_key, theirs.has_more)
    assert reader.key_misses == sum(1 for _, theirs in pairs if theirs.count) > 10


@pytest.mark.parametrize("budget", [1, 3000, 1 << 20])
def test_answers_are_what_protobuf_and_pyarrow_make(db, budget):
    db, _rows = db
    for i, batch in enumerate(read_all(db, budget)):
        values = batch.values()
        sid = b"" if not batch.has_more else bytes(range(16))
        log_offset = 5000 if i == 0 else None
        answer = scan_wire.answer(batch, scanner_id=sid, log_offset=log_offset)
        expected = pb.ScanKvResponse(scanner_id=sid, records=scan_batch.records_ipc(values), record_count=len(values),
                                     has_more_results=batch.has_more, resume_key=batch.last_key)
        if log_offset is not None:
            expected.log_offset = log_offset
        parsed = pb.ScanKvResponse.FromString(answer.data)
        assert parsed == expected  # every field, and records byte for byte
        assert answer.records_size == len(expected.records) <= max(budget + IPC_OVERHEAD, len(expected.records))
        if batch.count > 1 or len(values[0]) + ROW_OVERHEAD <= budget:
            assert answer.records_size <= budget + IPC_OVERHEAD  # a batch size covers the records
        client = client_wire.parse(answer.data)  # records a view of the bytes, the rest the message's
        assert isinstance(client.records, pa.Buffer) and client.records.to_pybytes() == expected.records
        assert ipc_to_batch(client.records).column(0).to_pylist() == values
        assert (client.scanner_id, client.record_count, client.has_more_results, client.resume_key) == \
            (sid, len(values), batch.has_more, batch.last_key)
        assert client.HasField("log_offset") == (log_offset is not None)


def test_an_empty_answer_and_the_header_template_cover_every_shape():
    answer = scan_wire.answer(scan_batch.EMPTY, log_offset=3)
    parsed = pb.ScanKvResponse.FromString(answer.data)
    assert parsed.record_count == 0 and not parsed.has_more_results and parsed.log_offset == 3
    assert ipc_to_batch(parsed.records).num_rows == 0
    for rows, size in [(1, 0), (2, 1), (1000, 7), (65_536, 1 << 20), (3, (1 << 31) - 9)]:
        offsets_size = 4 * (rows + 1)
        values = {"rows": rows, "offsets_size": offsets_size, "data_at": (offsets_size + 7) & ~7,
                  "data_size": size}
        metadata = scan_wire._HEADER.metadata(rows, size)
        message = pa.ipc.read_message(metadata + bytes(values["data_at"] + ((size + 7) & ~7))) if size < 1 << 20 \
            else None
        if message is not None:  # pyarrow reads the header as a record batch of that shape
            batch = pa.ipc.read_record_batch(message, scan_batch.VALUE_SCHEMA)
            assert batch.num_rows == rows


def test_client_parse_falls_back_to_protobuf_and_refuses_garbage():
    error = pb.ScanKvResponse(has_more_results=False)
    error.error.code, error.error.message = 7, "x"
    parsed = client_wire.parse(error.SerializeToString())  # no records: a plain message
    assert isinstance(parsed, pb.ScanKvResponse) and parsed.error.code == 7
    truncated = scan_wire.answer(scan_batch.Batch([b"abc"], np.array([0, 3], np.int32), b"k", False)).data[:-5]
    with pytest.raises(Exception):
        client_wire.parse(truncated)
