"""docs/spark.md's session snippet ("A session, start to end") runs as written (a fresh Python process, its
own SparkSession), and a session whose Python workers cannot import kvlease is refused by register() naming
PYSPARK_PYTHON."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvlease.client.table import TableClient
from kvlease.common.tables import Column
from kvlease.spark_source.workers import WorkerPythonError, missing_modules
from tests.support.paths import REPO
from tests.support.spark_tables import kv  # noqa: F401  (a fixture)

SPARK_PAGE = REPO / "docs" / "spark.md"
MARKER = "<!-- tests/spark_source/test_spark_readme.py runs this block as written"
COLUMNS = [Column("id", "BIGINT"), Column("customer", "STRING"), Column("amount", "DOUBLE")]
OTHER_PYTHON = "/usr/bin/python3"  # a python without the project's dependencies


def page_snippet() -> str:
    """The ```python block right after docs/spark.md's marker."""
    text = SPARK_PAGE.read_text()
    assert text.count(MARKER) == 1, "docs/spark.md's tested Spark snippet lost its marker"
    match = re.match(r"[^\n]*\n```python\n(.*?)\n```\n", text[text.index(MARKER):], re.S)
    assert match, "the marker is not followed by a ```python block"
    return match.group(1)


def cluster_dir(path: Path, kv) -> str:
    """A cluster directory (as `kvlease cluster start` writes it) naming the in-process cluster's coordinator."""
    path.mkdir()
    (path / "cluster.json").write_text(json.dumps({"coordinators": [{"address": kv.coordinator.address}]}))
    return str(path)


def without_spark_settings(scratch) -> dict[str, str]:
    """This process's environment without what the snippet must set itself; Spark's scratch space (its local
    dirs and the JVM's temp dir, /tmp by default, which a JVM ended by its Python leaves behind) in
    ``scratch``, which the test's tmp_path removes."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    return {**env, "SPARK_LOCAL_DIRS": str(scratch), "JDK_JAVA_OPTIONS": f"-Djava.io.tmpdir={scratch} -XX:-UsePerfData",
            "TMPDIR": str(scratch)}


@pytest.mark.spark
@pytest.mark.slow
def test_the_spark_page_session_snippet_runs_as_written(kv, tmp_path):
    kv.create_table("shop.orders", COLUMNS, ["id"], 2)
    kv.create_table("shop.copy", COLUMNS, ["id"], 2)
    ann, bo = {"id": 1, "customer": "ann", "amount": 12.5}, {"id": 2, "customer": "bo", "amount": 3.0}
    with TableClient(kv.admin, "shop.orders") as client:
        client.upsert([ann, bo])
    snippet = page_snippet()
    assert snippet.count('"/tmp/kv"') == 1
    script = snippet.replace('"/tmp/kv"', repr(cluster_dir(tmp_path / "kv", kv)))
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=without_spark_settings(tmp_path),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"\|\s*1\|\s*ann\|\s*12.5\|", done.stdout), done.stdout  # show() of the batch read
    with TableClient(kv.admin, "shop.copy") as client:
        assert client.lookup([1, 2, 3]) == [ann, bo, None]  # the stream copied the table
    with TableClient(kv.admin, "shop.orders") as client:
        assert client.lookup([3]) == [{"id": 3, "customer": "cy", "amount": 7.25}]  # the write


@pytest.mark.unit
def test_missing_modules_of_a_python(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `python -c` finds packages in its working directory
    assert missing_modules(sys.executable) == []
    if not os.path.exists(OTHER_PYTHON):
        pytest.skip(f"{OTHER_PYTHON} is not installed")
    env = {**os.environ, "PYTHONPATH": ""}  # the project itself out of reach, as without `pip install -e .`
    assert missing_modules(OTHER_PYTHON, env)[0] == "kvlease"
    with pytest.raises(WorkerPythonError, match="'/nowhere/python', which does not run"):
        missing_modules("/nowhere/python")


WRONG_WORKERS = textwrap.dedent("""
    import os, sys, tempfile
    os.environ["PYSPARK_PYTHON"] = sys.argv[1]
    os.environ.setdefault("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from kvlease import spark_source
    from kvlease.ops.streaming import stop_local_session
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.sql.warehouse.dir", tempfile.mkdtemp()).getOrCreate())
    try:
        try:
            spark_source.register(spark)
            print("REGISTERED")
        except spark_source.WorkerPythonError as exc:
            print("REFUSED", exc)
        # what a query does without the check: Spark's worker fails to import the source
        spark.dataSource.register(spark_source.KvLeaseDataSource)
        try:
            spark.read.format("kvlease").option("bootstrap", "127.0.0.1:1").option("table", "a.b").load()
        except Exception as exc:
            print("LOAD", "No module named" in str(exc))
    finally:
        stop_local_session(spark)
""")


@pytest.mark.spark
def test_register_refuses_workers_that_cannot_import_the_source(tmp_path):
    if not os.path.exists(OTHER_PYTHON):
        pytest.skip(f"{OTHER_PYTHON} is not installed")
    done = subprocess.run([sys.executable, "-c", WRONG_WORKERS, OTHER_PYTHON], cwd=tmp_path,
                          env=without_spark_settings(tmp_path), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    refused = next((line for line in lines if line.startswith("REFUSED ")), None)
    assert refused is not None, done.stdout
    assert f"run '{OTHER_PYTHON}' (PYSPARK_PYTHON), which cannot import" in refused
    assert f"Set PYSPARK_PYTHON={sys.executable}" in refused
    assert "LOAD True" in lines, done.stdout  # the check named a python that really fails
