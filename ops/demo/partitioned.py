"""The demo's partitioned table: ``demo.orders_by_day``, partitioned by day (docs/partitions.md).

:func:`show_partitioned` writes a few rows into each of three days (each day's partition created by the write),
lists the partitions (name, id) and reads one of them back through a partition's table client; it returns what
it saw and a check that the partition read holds exactly the rows written to it.
"""

from __future__ import annotations

from typing import Any, Callable

from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.common.tables import Column
from kvlease.ops import local_cluster
from kvlease.ops.check import Check

TABLE = "demo.orders_by_day"
DAYS = ("20261127", "20261128", "20261129")
ROWS_PER_DAY = 1_000


def show_partitioned(cluster_dir: str, progress: Callable[[str], None]) -> tuple[dict[str, Any], Check]:
    """Create, write, list and read the partitioned table on the running cluster in ``cluster_dir``."""
    addresses = [c["address"] for c in local_cluster.load(cluster_dir)["coordinators"]]
    with AdminClient(addresses) as admin:
        admin.create_table(TABLE, [Column("day", "STRING"), Column("id", "BIGINT"), Column("amount", "DOUBLE")],
                           ["day", "id"], 2, replication_factor=2, partition_key=["day"])
        with TableClient(admin, TABLE) as client:
            for day in DAYS:
                client.upsert([{"day": day, "id": i, "amount": i / 100} for i in range(ROWS_PER_DAY)])
        _table, partitions = admin.list_partitions(TABLE)
        progress(f"partitioned table {TABLE}: {ROWS_PER_DAY:,} rows into each of {len(DAYS)} days; partitions "
                 + ", ".join(f"{p.name} (id {p.partition_id})" for p in partitions))
        read = DAYS[-1]
        with TableClient(admin, TABLE, partition=read) as client:
            rows = sum(batch.num_rows for batch in client.scan().batches)
        progress(f"partition {read} of {TABLE} scanned: {rows:,} rows")
    doc = {"table": TABLE, "partitions": [{"name": p.name, "id": p.partition_id} for p in partitions],
           "read_partition": read, "rows_read": rows}
    problems = [] if rows == ROWS_PER_DAY else [f"partition {read}: {rows} rows read, {ROWS_PER_DAY} written"]
    if sorted(p.name for p in partitions) != list(DAYS):
        problems.append(f"partitions {[p.name for p in partitions]}, expected {list(DAYS)}")
    return doc, Check.of("the partitioned table has a partition per day written, each read as written",
                         problems, len(DAYS))
