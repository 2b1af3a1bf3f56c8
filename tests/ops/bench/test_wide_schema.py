"""The wide rows of ``bench writes --schema wide`` and ``bench scan --schema wide``: 20 columns of mixed types
that the codec takes as they are, a function of the ids, with some nulls."""

from __future__ import annotations

import numpy as np
import pytest

from kvlease.common.codec import RowCodec
from kvlease.common.tables import TableInfo
from kvlease.ops.bench.wide_schema import WIDE_COLUMNS, wide_batch

pytestmark = pytest.mark.unit


def test_wide_rows_have_20_columns_of_the_tables_types_and_round_trip():
    codec = RowCodec(TableInfo(0, "bench", "wide", tuple(WIDE_COLUMNS), ("id",), 1))
    batch = wide_batch(np.arange(1000, 3000))
    assert len(WIDE_COLUMNS) == 20 and batch.schema == codec.schema  # no cast needed on write
    assert {"DECIMAL(12,2)", "DATE", "TIMESTAMP", "ARRAY<STRING>"} <= {c.type for c in WIDE_COLUMNS}
    assert batch.equals(wide_batch(np.arange(1000, 3000)))  # a function of the ids
    nulls = sum(batch.column(i).null_count for i in range(1, 20)) / (19 * batch.num_rows)
    assert 0.03 < nulls < 0.12
    keys, values = codec.encode_arrays(batch)
    assert codec.decode_values(values).equals(batch)
