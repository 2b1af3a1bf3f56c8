"""Where the local SparkSession's Python workers come from, and how they are scheduled.

Spark gives a Python worker it starts for a data source a fixed 10 s to
connect back; these check the two things the session does so that a busy
machine does not make a query fail on it (ops/streaming/spark.py,
tests/conftest.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pyspark
import pytest
from pyspark.sql.functions import udf


def test_python_workers_import_pyspark_from_its_installed_package_not_from_sparks_zip(spark):
    where = udf(lambda _: __import__("pyspark").__file__)
    assert spark.range(1).select(where("id")).first()[0] == pyspark.__file__


def test_the_spark_jvm_runs_in_an_autogroup_of_its_own_when_the_suite_runs_on_workers(spark):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("without pytest-xdist the session stays in its terminal's autogroup")
    if not Path("/proc/self/autogroup").exists():
        pytest.skip("this kernel has no autogroups")
    from pyspark import SparkContext

    jvm = SparkContext._gateway.proc.pid
    assert Path(f"/proc/{jvm}/autogroup").read_text() != Path(f"/proc/{os.getppid()}/autogroup").read_text()
