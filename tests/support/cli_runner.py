"""Running the kvlease CLI in-process for the ``test_cli_*_unit`` tests (click's CliRunner), and a fake
TableClient for the data commands."""

from __future__ import annotations

from click.testing import CliRunner

from kvlease.client.log_position import LogPosition
from kvlease.common.codec import RowCodec
from kvlease.common.tables import TableInfo
from kvlease.ops.cli import kvlease

NO_ENV = {"KVLEASE_CLUSTER": None, "KVLEASE_BOOTSTRAP": None, "KVLEASE_RETRY_TIMEOUT": None,
          "KVLEASE_DEBUG": None, "KVLEASE_CLIENT_RETRY_TOTAL_TIMEOUT": None,
          "KVLEASE_CA_FILE": None, "KVLEASE_CERT_FILE": None, "KVLEASE_KEY_FILE": None,
          "KVLEASE_SECURITY_USERNAME": None, "KVLEASE_SECURITY_PASSWORD": None, "KVLEASE_PASSWORD_FILE": None,
          "KVLEASE_NEW_USER_PASSWORD": None}


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(kvlease, list(args), env={**NO_ENV, **(env or {})}, prog_name="kvlease")


def assert_one_line_error(result, code: int = 1) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == ""
    return lines[0]


class FakeTableClient:
    """Records writes; lookups answer from what was written."""

    def __init__(self, table: TableInfo) -> None:
        self.table = table
        self.codec = RowCodec(table)
        self.upserts: list[list[dict]] = []
        self.rows: dict[tuple, dict] = {}
        self.records = [{"offset": i, "change_type": "+I", "timestamp": 1_700_000_000_000 + i if i else None,
                         "row": {"id": i, "name": f"n{i}"}} for i in range(5)]  # offset 0: a v1 entry
        self.fetches: list[int] = []
        self.epochs_sent: list[int | None] = []  # fetch_log_from: every entry is of leader epoch 3
        self.waits_sent: list[int] = []  # fetch_log_from's max_wait_ms (answered at once, as an old server does)

    def _key(self, row):
        return tuple(row[k] for k in self.table.primary_key)

    def upsert(self, rows):
        batch = rows if isinstance(rows, list) else rows.to_pylist()
        self.upserts.append(batch)
        for row in batch:
            self.rows[self._key(row)] = row
        return {0: (0, len(batch))}

    def lookup(self, keys):
        return [self.rows.get(self._key(k)) for k in keys]

    def delete(self, keys):
        gone = [self.rows.pop(self._key(k), None) for k in keys]
        return {0: (10, 10 + sum(g is not None for g in gone))}

    def list_offsets(self, buckets=None, timestamp=None):
        if timestamp is not None:  # the first record at or after it; the end (5) if none
            return {b: next((r["offset"] for r in self.records if (r["timestamp"] or -1) >= timestamp), 5)
                    for b in buckets}
        return {b: (2, 5) for b in buckets}

    def positions(self, offsets):  # the epoch below each offset: none at or below the log start (2), past the end
        return {b: LogPosition(o, 3 if 2 < o <= 5 else None) for b, o in offsets.items()}

    def fetch_log(self, bucket, from_offset, max_bytes=0):
        self.fetches.append(from_offset)
        return self.records[from_offset:from_offset + 2], 5

    def fetch_log_from(self, bucket, position, max_bytes=0, max_wait_ms=0):
        records, end = self.fetch_log(bucket, position.offset, max_bytes)
        self.epochs_sent.append(position.epoch)
        self.waits_sent.append(max_wait_ms)
        return records, end, LogPosition(records[-1]["offset"] + 1 if records else position.offset, 3)

    def close(self):
        pass
