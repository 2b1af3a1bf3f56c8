"""What a Spark user sees of a bad option, on real Spark (local[2]): PySpark wraps a Python source's error in its
own exception (``AnalysisException`` ``[PYTHON_DATA_SOURCE_ERROR]``, ``StreamingQueryException``) with the
error's traceback; in it stands kvlease's message, one line, with a near miss's ``did you mean``, and none of
the option parser's frames. No cluster: the options fail before anything is asked of one."""

from __future__ import annotations

import pytest

NOWHERE = "127.0.0.1:1"  # never reached: every case fails on its options first
LINE = "kvlease.spark_source.options.OptionError: "


def kvlease_lines(error: BaseException) -> list[str]:
    return [line for line in str(error).splitlines() if line.startswith(LINE)]


def read(spark, stream: bool = False, **options):
    reader = (spark.readStream if stream else spark.read).format("kvlease").option("bootstrap", NOWHERE)
    for key, value in options.items():
        reader = reader.option(key.replace("_", "."), value)
    return reader.load()


@pytest.mark.parametrize("stream, options, message", [
    (False, {"tabel": "shop.orders"}, "unknown option 'tabel': did you mean 'table'?"),
    (True, {"table": "shop.orders", "startup_mod": "earliest"}, "unknown option 'startup.mod': did you mean "
                                                                 "'startup.mode'?"),
    (True, {"table": "shop.orders", "startup_mode": "earlist"}, "option 'startup.mode': 'earlist' is not one of "
                                                                "full, earliest, latest, timestamp; did you mean "
                                                                "'earliest'?"),
    (False, {"table": "shop.orders", "split_max-rows": "many"}, "option 'split.max-rows': expected a positive "
                                                                "integer, got 'many'"),
    (False, {}, "option 'table' (DB.NAME) is required"),
], ids=["read-name", "stream-name", "stream-value", "read-int", "read-missing"])
def test_a_bad_read_option_is_one_kvlease_line_in_sparks_exception(spark, stream, options, message):
    with pytest.raises(Exception) as info:
        read(spark, stream, **options)
    assert "PYTHON_DATA_SOURCE_ERROR" in str(info.value)
    assert kvlease_lines(info.value) == [LINE + message]
    assert "spark_source/options.py" not in str(info.value)  # the parser's frames are not the user's business


def test_a_bad_write_option_is_one_kvlease_line_in_sparks_exception(spark, tmp_path):
    near_miss = [LINE + "unknown option 'tabel': did you mean 'table'?"]
    df = spark.createDataFrame([(1,)], "id BIGINT")
    with pytest.raises(Exception) as info:
        df.write.format("kvlease").option("bootstrap", NOWHERE).option("tabel", "shop.orders").mode("append").save()
    assert kvlease_lines(info.value) == near_miss
    query = (spark.readStream.format("rate").load().writeStream.format("kvlease").option("bootstrap", NOWHERE)
             .option("tabel", "shop.orders").option("checkpointLocation", str(tmp_path)).start())
    try:
        with pytest.raises(Exception) as info:  # a streaming sink is set up with the first micro-batch
            query.awaitTermination(120)
    finally:
        query.stop()
    assert kvlease_lines(info.value) == near_miss
    with pytest.raises(Exception) as info:
        spark.sql(f"CREATE TABLE misspelt USING kvlease OPTIONS (bootstrap '{NOWHERE}', tabel 'shop.orders')")
    assert kvlease_lines(info.value) == near_miss
