"""The demo's query plumbing without Spark (ops/streaming/stream_query.py): one-line errors out of Spark's messages,
the checkpoint's offsets, an output with nothing in it."""

from __future__ import annotations

import pytest

from kvlease.common import errors
from kvlease.ops.streaming import stream_query

pytestmark = pytest.mark.unit

SINK_FAILED = """An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/x/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
  File "/tmp/q.py", line 13, in sink
    raise RuntimeError("planted failure in the sink")
RuntimeError: planted failure in the sink

=== Streaming Query ===
Identifier: [id = 7e3440fe, runId = e5a77f7d]
Current Available Offsets: {x: {"lease": "spark-stream-51", "buckets": {}}}
Caused by: org.apache.spark.api.python.PythonException: ValueError: not this one
"""
OPTION_FAILED = """[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: Traceback (most recent call last):
  File "/w/spark_source/options.py", line 171, in _positive_duration
    raise OptionError(f"option '{name}': {exc}") from None
spark_source.options.OptionError: option 'lease.duration': not a duration: '-5s' (use e.g. 500ms, 1s, 10m, 2h, 1d)
 SQLSTATE: 38000"""


@pytest.mark.parametrize("text, line", [
    (SINK_FAILED, "RuntimeError: planted failure in the sink"),
    (OPTION_FAILED, "OptionError: option 'lease.duration': not a duration: '-5s' (use e.g. 500ms, 1s, 10m, 2h, 1d)"),
    ("no traceback here\nsecond line", "no traceback here"),
    ("x" * 600, "x" * 497 + "..."),
])
def test_a_spark_error_becomes_one_line(text, line):
    assert stream_query.error_line(Exception(text)) == line


def test_checkpoint_offsets_read_the_last_line_of_a_micro_batch(tmp_path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "3").write_text('v1\n{"batchWatermarkMs":0}\n'
                                            '{"lease": "l", "buckets": {"0": {"snapshot": 4, "offset": 10}, '
                                            '"1": {"snapshot": -1, "offset": 7}}}\n')
    assert stream_query.checkpoint_offsets(tmp_path, 3) == {0: (4, 10), 1: (-1, 7)}


def test_an_output_without_files_is_an_error(tmp_path):
    with pytest.raises(errors.KvLeaseError, match="wrote no Parquet file"):
        stream_query.read_output(tmp_path)
