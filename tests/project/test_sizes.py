"""No hand-written module over 450 lines, no function over 60 (issue 29): split by concept instead.

Hand-written: every tracked ``.py`` file of the repository except generated
protobuf code (``*_pb2*.py``). A function's length is ``end_lineno - lineno + 1``
of its definition (decorators not counted), nested functions on their own.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest
from tests.support.paths import REPO

ROOT = REPO
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def hand_written() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "*.py"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\0")
    return [ROOT / name for name in sorted(set(listed))
            if name and "_pb2" not in Path(name).name and not name.startswith(".venv/") and (ROOT / name).is_file()]


def offenders(paths: list[Path], root: Path = ROOT) -> tuple[list[str], list[str]]:
    """``(long modules, long functions)``, each as ``path: N lines`` / ``path:LINE name: N lines``."""
    modules, functions = [], []
    for path in paths:
        text = path.read_text()
        name = path.relative_to(root)
        if (lines := text.count("\n")) > MAX_MODULE_LINES:
            modules.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (length := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    functions.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return modules, functions


@pytest.mark.unit
def test_the_check_finds_a_long_module_and_a_long_function(tmp_path):
    long_body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{long_body}\n" + "\n" * MAX_MODULE_LINES)
    (tmp_path / "short.py").write_text("def short():\n    return 1\n")
    modules, functions = offenders([tmp_path / "long.py", tmp_path / "short.py"], tmp_path)
    assert modules == [f"long.py: {MAX_FUNCTION_LINES + 1 + MAX_MODULE_LINES} lines"]
    assert functions == [f"long.py:1 long: {MAX_FUNCTION_LINES + 1} lines"]


@pytest.mark.unit
def test_no_module_over_450_lines_and_no_function_over_60():
    modules, functions = offenders(hand_written())
    assert not modules and not functions, (
        f"split by concept (one module per concept, helpers or steps for a long function):\n"
        f"modules over {MAX_MODULE_LINES} lines:\n  " + "\n  ".join(modules or ["none"]) +
        f"\nfunctions over {MAX_FUNCTION_LINES} lines:\n  " + "\n  ".join(functions or ["none"]))
