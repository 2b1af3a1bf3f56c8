"""``python -m kvlease.ops.proto [OUT]``: the gRPC modules of ``common/proto/*.proto``, as the code imports them.

protoc names a generated module after its ``.proto`` path (``common/proto/tablet.proto`` ->
``common.proto.tablet_pb2``) and imports the modules of the files it imports by those names; the project's
packages live under ``kvlease`` (``setup.py``), so each generated module's own name and its imports are
given the ``kvlease.`` prefix. ``make proto`` writes them beside the ``.proto`` files;
``tests/common/test_proto_generated.py`` checks the committed ones are what this makes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

#: the folder holding ``common/`` (the repository's root, or ``kvlease/`` of an installed wheel)
ROOT = Path(__file__).resolve().parent.parent
_MODULE_NAME = re.compile(r"(['\"])(common\.proto\.\w+)\1")
_IMPORT = re.compile(r"^from common\.proto import ", re.M)


def protos() -> list[str]:
    """The ``.proto`` files, as paths relative to :data:`ROOT` (``common/proto/tablet.proto``)."""
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "common" / "proto").glob("*.proto"))


def generate(proto: str, out: Path) -> list[Path]:
    """Run protoc on ``proto`` into ``out`` (``out/common/proto/…``) and prefix its module names; the files."""
    result = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={out}",
                             f"--grpc_python_out={out}", proto], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"protoc {proto}: {result.stderr.strip()}")
    stem = proto.removesuffix(".proto")
    made = [out / f"{stem}{suffix}" for suffix in ("_pb2.py", "_pb2_grpc.py")]
    for path in made:
        text = _MODULE_NAME.sub(lambda m: f"{m.group(1)}kvlease.{m.group(2)}{m.group(1)}", path.read_text())
        path.write_text(_IMPORT.sub("from kvlease.common.proto import ", text))
    return made


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT
    for proto in protos():
        for path in generate(proto, out):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
