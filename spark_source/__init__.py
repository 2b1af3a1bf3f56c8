"""The ``kvlease`` PySpark Data Source: bootstrap-then-tail reads and upsert writes (docs/spark.md).

    from kvlease.spark_source import register
    register(spark)
    spark.read.format("kvlease").option("cluster", d).option("table", "shop.orders").load()
"""

from __future__ import annotations

import kvlease.common  # noqa: F401  (first: it settles gRPC's fork setting before anything imports grpc)
from kvlease.spark_source.batch import PUSHDOWN_PLANS_PER_SCAN
from kvlease.spark_source.source import KvLeaseDataSource
from kvlease.spark_source.workers import WorkerPythonError, check_workers

__all__ = ["KvLeaseDataSource", "WorkerPythonError", "register"]


#: The setting under which Spark hands a Python source's reader the filters of a query.
FILTER_PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


def register(spark) -> None:
    """Register the source as ``kvlease`` on ``spark``. On a Spark that keeps the plan made while a query's
    filters were pushed with that query alone (not Spark 4.3: ``batch.py``), also turn on
    :data:`FILTER_PUSHDOWN`, for reads of a partitioned table to prune partitions by the filters Spark
    pushes (Spark gives every one back to be applied to the rows read; it refuses such a read while the
    setting is off). A read of an unpartitioned table pushes no filter (docs/spark.md, "Filters").

    With a local master, first checks that Spark's Python workers (``PYSPARK_PYTHON``) can import the
    source, and raises :class:`WorkerPythonError` saying what to set if they cannot."""
    check_workers(spark)
    spark.dataSource.register(KvLeaseDataSource)
    if PUSHDOWN_PLANS_PER_SCAN:
        spark.conf.set(FILTER_PUSHDOWN, "true")
