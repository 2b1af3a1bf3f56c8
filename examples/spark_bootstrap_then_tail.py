"""A Spark streaming job: bootstrap a table (its rows, from leased snapshots), then tail its changes.

    python examples/spark_bootstrap_then_tail.py --cluster DIR --table shop.orders --out /tmp/orders-feed
    python examples/spark_bootstrap_then_tail.py ... --follow     # keep tailing until Ctrl-C

The first micro-batch is the bootstrap: every row of the table, ``_change_type`` ``insert``. Later ones
are the changelog: ``insert``, ``update_preimage``, ``update_postimage``, ``delete``, with ``_bucket``,
``_log_offset`` and ``_commit_timestamp``. They go to Parquet files in ``--out``; the checkpoint (default
``OUT-checkpoint``) remembers how far the query got, so running it again tails from there. Without
``--follow`` it reads what is there now and stops (``Trigger.AvailableNow``).
"""

from __future__ import annotations

import argparse
import os
import sys

from kvlease import spark_source  # import kvlease's packages first: they set gRPC up before anything imports grpc
from kvlease.client.connect import find_cluster
from kvlease.common.errors import KvLeaseError


def start(spark, connection: dict[str, str], table: str, out: str, checkpoint: str, follow: bool = False):
    """Start the query reading ``table`` into Parquet files in ``out``; returns the StreamingQuery."""
    reader = spark.readStream.format("kvlease").option("table", table)  # startup.mode "full": bootstrap, then tail
    for name, value in connection.items():  # "cluster" or "bootstrap" (and TLS options, if the cluster has TLS)
        reader = reader.option(name, value)
    writer = reader.load().writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
    writer = writer.trigger(processingTime="5 seconds") if follow else writer.trigger(availableNow=True)
    return writer.start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", help="a cluster directory (default: KVLEASE_CLUSTER)")
    parser.add_argument("--bootstrap", help="coordinator addresses HOST:PORT,… (default: KVLEASE_BOOTSTRAP)")
    parser.add_argument("--table", required=True, help="DB.NAME")
    parser.add_argument("--out", required=True, help="a directory for the Parquet files")
    parser.add_argument("--checkpoint", help="the query's checkpoint directory (default: OUT-checkpoint)")
    parser.add_argument("--follow", action="store_true", help="keep tailing (a micro-batch every 5 s)")
    args = parser.parse_args()
    # the same rules as the CLI and kvlease.connect(): --cluster/--bootstrap, else KVLEASE_BOOTSTRAP/_CLUSTER
    # (with KVLEASE_BOOTSTRAP and TLS, add the "ca-file" etc. options; a --secure cluster directory brings its own)
    try:
        addresses, directory = find_cluster(args.cluster, args.bootstrap)
    except KvLeaseError as exc:  # every kvlease error has a one-line message that says what to do
        raise SystemExit(f"error: {exc.message}") from None
    connection = {"cluster": directory} if directory else {"bootstrap": ",".join(addresses)}

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's Python workers: this Python, with kvlease
    spark = (SparkSession.builder.master("local[2]").appName("kvlease-tail")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_source.register(spark)  # makes format("kvlease") known to this session
    query = start(spark, connection, args.table, args.out,
                  args.checkpoint or args.out.rstrip("/") + "-checkpoint", args.follow)
    try:
        query.awaitTermination()  # AvailableNow: until what is there now is written; --follow: until Ctrl-C
    except KeyboardInterrupt:
        query.stop()
    written = spark.read.parquet(args.out)  # everything the query wrote so far, this run and earlier ones
    print({row["_change_type"]: row["count"] for row in written.groupBy("_change_type").count().collect()})
    spark.stop()


if __name__ == "__main__":
    main()
