"""The committed ``*_pb2.py`` / ``*_pb2_grpc.py`` are exactly what protoc makes of the ``.proto`` files.

Regenerate with ``make proto`` after editing a ``.proto`` file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.paths import REPO

pytestmark = pytest.mark.unit

REPO = REPO
PROTO_DIR = REPO / "common" / "proto"
PROTOS = sorted(p.relative_to(REPO).as_posix() for p in PROTO_DIR.glob("*.proto"))


def test_there_are_proto_files():
    assert "common/proto/coordinator.proto" in PROTOS


@pytest.mark.parametrize("proto", PROTOS)
def test_generated_modules_match_protoc_output(proto, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={tmp_path}",
         f"--grpc_python_out={tmp_path}", proto],
        cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    stem = proto[: -len(".proto")]
    for suffix in ("_pb2.py", "_pb2_grpc.py"):
        generated = tmp_path / f"{stem}{suffix}"
        committed = REPO / f"{stem}{suffix}"
        assert generated.exists(), f"protoc made no {stem}{suffix}"
        assert committed.exists(), f"{stem}{suffix} is not committed: run `make proto`"
        assert committed.read_bytes() == generated.read_bytes(), f"{stem}{suffix} is stale: run `make proto`"


def test_no_generated_module_without_its_proto():
    stems = {p[: -len(".proto")].rsplit("/", 1)[-1] for p in PROTOS}
    orphans = [p.name for p in PROTO_DIR.glob("*_pb2*.py")
               if p.name.removesuffix("_grpc.py").removesuffix(".py").removesuffix("_pb2") not in stems]
    assert orphans == [], f"generated modules whose .proto is gone: {orphans}"
