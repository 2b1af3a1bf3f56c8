"""The committed ``*_pb2.py`` / ``*_pb2_grpc.py`` are exactly what protoc makes of the ``.proto`` files.

Regenerate with ``make proto`` after editing a ``.proto`` file.
"""

from __future__ import annotations

import pytest
from kvlease.ops import proto as proto_gen
from tests.support.paths import REPO

pytestmark = pytest.mark.unit

PROTO_DIR = REPO / "common" / "proto"
PROTOS = proto_gen.protos()


def test_there_are_proto_files():
    assert "common/proto/coordinator.proto" in PROTOS


@pytest.mark.parametrize("proto", PROTOS)
def test_generated_modules_match_protoc_output(proto, tmp_path):
    for generated in proto_gen.generate(proto, tmp_path):
        committed = REPO / generated.relative_to(tmp_path)
        assert committed.exists(), f"{committed.name} is not committed: run `make proto`"
        assert committed.read_bytes() == generated.read_bytes(), f"{committed.name} is stale: run `make proto`"
    assert "from common" not in committed.read_text()  # its imports go through kvlease, as every import does


def test_no_generated_module_without_its_proto():
    stems = {p[: -len(".proto")].rsplit("/", 1)[-1] for p in PROTOS}
    orphans = [p.name for p in PROTO_DIR.glob("*_pb2*.py")
               if p.name.removesuffix("_grpc.py").removesuffix(".py").removesuffix("_pb2") not in stems]
    assert orphans == [], f"generated modules whose .proto is gone: {orphans}"
