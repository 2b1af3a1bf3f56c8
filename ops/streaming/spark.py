"""A local SparkSession (``local[N]``) with the kvlease source registered, for the demo, the benchmarks and
the tests; and stopping it for good.

``SparkSession.stop()`` leaves py4j's JVM running until the Python process
exits, so :func:`stop_local_session` shuts the gateway down and kills the JVM
(and with it Spark's Python daemon and workers).
"""

from __future__ import annotations

import os
import shlex
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

JAVA_HOME = "/usr/lib/jvm/java-17-openjdk-amd64"


def local_session(work_dir: str | os.PathLike[str], *, cores: int | str = "*", app: str = "kvlease",
                  shuffle_partitions: int = 2, log_file: str | os.PathLike[str] | None = None,
                  conf: Mapping[str, str] | None = None):
    """A SparkSession on this machine: loopback only, no UI, scratch space under ``work_dir``.

    ``conf``: more settings for the session's builder (e.g. the freshness benchmark's
    :data:`~kvlease.ops.bench.freshness_spark.LOW_LATENCY_CONF`), applied last: one of the settings below
    given there is overridden.

    ``log_file``: the JVM's stdout and stderr (its start-up notes, Spark's
    log, and those of the Python workers it starts) go there instead of this
    process's terminal.
    """
    work_dir = Path(work_dir)
    if log_file is not None:
        with _output_to(log_file):
            return local_session(work_dir, cores=cores, app=app, shuffle_partitions=shuffle_partitions, conf=conf)
    os.environ.setdefault("JAVA_HOME", JAVA_HOME)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = worker_python(work_dir)
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from kvlease.spark_source import register

    builder = (SparkSession.builder.master(f"local[{cores}]").appName(app)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
             .config("spark.local.dir", str(work_dir / "local"))
             .config("spark.sql.warehouse.dir", str(work_dir / "warehouse"))
             .config("spark.sql.session.timeZone", "UTC")
             # no /tmp/hsperfdata_* file left behind by a JVM that does not exit by itself
             .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={work_dir} -XX:-UsePerfData"))
    for key, value in (conf or {}).items():  # last: a setting given overrides the one above
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def worker_python(work_dir: Path) -> str:
    """The Python that Spark starts its workers with: this interpreter, importing PySpark from its installed
    package, where its modules are compiled once, rather than from ``pyspark.zip``, which Spark puts first
    on a worker's ``PYTHONPATH`` and whose modules are compiled again by every worker it starts (1.3 s of
    CPU instead of 0.4 s). It matters beyond speed: Spark gives a worker it starts for a data source a fixed
    10 s to connect back ("Python worker failed to connect back"). The installed package is the same
    release as the zip (the zip ships inside it); where there is none, Spark's path is left as it is."""
    import pyspark

    installed = Path(pyspark.__file__).parent
    if not (installed / "python" / "lib" / "pyspark.zip").is_file():
        return sys.executable
    launcher = work_dir / "worker-python"
    work_dir.mkdir(parents=True, exist_ok=True)
    zips = shlex.quote(f"{installed}/python/lib/")
    launcher.write_text(  # shell builtins only: no process but the worker's per start
        "#!/bin/sh\n"
        "# Spark's Python workers: PySpark from its installed package, not the zips Spark puts on PYTHONPATH\n"
        f"set -f; zips={zips}; given=$PYTHONPATH; PYTHONPATH=; IFS=:\n"
        "for entry in $given; do case $entry in \"$zips\"*) ;; *) PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$entry;; esac; done\n"
        "export PYTHONPATH\n"
        f"exec {shlex.quote(sys.executable)} \"$@\"\n")
    launcher.chmod(0o755)
    return str(launcher)


@contextmanager
def _output_to(path: str | os.PathLike[str]) -> Iterator[None]:
    """File descriptors 1 and 2 point at ``path`` while inside (children started then keep it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def stop_local_session(spark, log_file: str | os.PathLike[str] | None = None) -> None:
    """Stop ``spark`` and kill its JVM. ``log_file``: what is printed meanwhile (PySpark's accumulator server
    prints a traceback when the JVM hangs up on it first, which an interrupted job makes likely) goes there."""
    if log_file is not None:
        with _output_to(log_file):
            return stop_local_session(spark)
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    try:
        spark.stop()
    finally:
        if gateway is not None:
            gateway.shutdown()
        if proc is not None:
            proc.kill()
            proc.wait(30)
        SparkContext._gateway = None
        SparkContext._jvm = None
