"""The ``kvlease`` PySpark Data Source: bootstrap-then-tail reads and upsert writes (docs/spark.md).

    from kvlease.spark_source import register
    register(spark)
    spark.read.format("kvlease").option("cluster", d).option("table", "shop.orders").load()
"""

from __future__ import annotations

import kvlease.common  # noqa: F401  (first: it settles gRPC's fork setting before anything imports grpc)
from kvlease.spark_source.source import KvLeaseDataSource
from kvlease.spark_source.workers import WorkerPythonError, check_workers

__all__ = ["KvLeaseDataSource", "WorkerPythonError", "register"]


def register(spark) -> None:
    """Register the source as ``kvlease`` on ``spark``. It pushes no filter (Spark applies them all), so
    it reads the same with ``spark.sql.python.filterPushdown.enabled`` on or off; this leaves it as is.

    With a local master, first checks that Spark's Python workers (``PYSPARK_PYTHON``) can import the
    source, and raises :class:`WorkerPythonError` saying what to set if they cannot."""
    check_workers(spark)
    spark.dataSource.register(KvLeaseDataSource)
