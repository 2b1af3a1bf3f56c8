"""Packed byte strings of the Lookup wire (common/lookup_wire.py): round trips, slices, and bad offsets refused."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from kvlease.common import errors, lookup_wire

pytestmark = pytest.mark.unit


def test_pack_and_unpack_round_trip_any_slice():
    array = pa.array([b"a", b"", b"bcd", b"\x00\xff", b"e" * 300], pa.binary())
    for piece in (array, array.slice(1, 3), array.slice(4), array.slice(2, 0), pa.array(["x", "yz"])):
        data, offsets = lookup_wire.pack(piece)
        back = lookup_wire.unpack(data, offsets, "keys")
        assert back.to_pylist() == piece.cast(pa.binary()).to_pylist()
        assert len(offsets) == 4 * (len(piece) + 1) and len(data) == sum(len(v) for v in back.to_pylist())


@pytest.mark.parametrize("data, offsets", [
    (b"abc", b""), (b"abc", b"\x00\x00\x00"), (b"abc", np.array([0, 2], "<i4").tobytes()),
    (b"abc", np.array([1, 3], "<i4").tobytes()), (b"abc", np.array([0, 2, 1, 3], "<i4").tobytes()),
])
def test_offsets_that_do_not_cut_the_data_are_refused(data, offsets):
    with pytest.raises(errors.InvalidRequestError, match="keys"):
        lookup_wire.unpack(data, offsets, "keys")


def test_masks_round_trip():
    mask = np.array([True, False, False, True])
    assert lookup_wire.unpack_mask(lookup_wire.pack_mask(mask)).tolist() == mask.tolist()
    assert lookup_wire.pack_mask(np.zeros(0, bool)) == b""


def test_few_strings_pack_and_unpack_as_arrays_do():
    values = [b"a", b"", b"bcd", b"\x00\xff", b"e" * 300, b"f", b"g", b"h", b"i", b"j"]
    for count in range(len(values) + 1):  # up to FEW with struct, more through Arrow
        piece = values[:count]
        packed = lookup_wire.pack_list(piece)
        assert packed == lookup_wire.pack(pa.array(piece, pa.binary()))
        assert lookup_wire.unpack_list(*packed, "keys") == piece
    assert lookup_wire.pack_list(pa.array([b"x"])) == lookup_wire.pack(pa.array([b"x"]))
    assert lookup_wire.pack_mask([True, False, True]) == lookup_wire.pack_mask(np.array([True, False, True]))


@pytest.mark.parametrize("data, offsets", [
    (b"abc", b""), (b"abc", b"\x00\x00\x00"), (b"abc", np.array([0, 2], "<i4").tobytes()),
    (b"abc", np.array([1, 3], "<i4").tobytes()), (b"abc", np.array([0, 2, 1, 3], "<i4").tobytes()),
    (b"abc", np.array([0, 4, 3], "<i4").tobytes()),
])
def test_few_strings_with_bad_offsets_are_refused_as_arrays_are(data, offsets):
    with pytest.raises(errors.InvalidRequestError, match="keys"):
        lookup_wire.unpack_list(data, offsets, "keys")
