"""Classes are composed of parts, not assembled from mixins (issue 40).

No class of the project (outside the tests) inherits from more than one class of the project: an owner
holds its parts and delegates to them (e.g. :class:`kvlease.tablet.bucket.store.BucketStore`,
:class:`kvlease.tablet.replicas.manager.ReplicaManager`, :class:`kvlease.client.admin.AdminClient`). A base is a project class when
its name is imported from a project module or defined in the same module. No exception class needs an
exemption: each error class has at most one project base (a builtin one besides, such as TimeoutError, is
not a project class).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from tests.support.paths import REPO

PACKAGES = ("common", "leases", "client", "kvlease", "coordinator", "tablet", "ops", "spark_source")


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _project_names(tree: ast.Module, packages: tuple[str, ...]) -> set[str]:
    """The names bound in a module to project modules or their members (``from tablet.x import A``,
    ``import tablet.x``), and the classes it defines."""
    names = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in packages:
                names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names
                         if alias.name.split(".")[0] in packages)
    return names


def _base_root(base: ast.expr) -> str | None:
    """``A`` of a base ``A`` or ``mod.A`` (the name the module bound), else None (a call, a subscript…)."""
    while isinstance(base, ast.Attribute):
        base = base.value
    return base.id if isinstance(base, ast.Name) else None


def mixed_classes(paths: list[Path], root: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """``module:Class`` of every class with more than one project class among its bases."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        project = _project_names(tree, packages)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            ours = [b for b in node.bases if _base_root(b) in project]
            if len(ours) > 1:
                found.append(f"{_module_name(path, root)}:{node.name}")
    return found


def project_files() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))
            if "_pb2" not in path.name]


@pytest.mark.unit
def test_no_class_is_assembled_from_mixins():
    assert mixed_classes(project_files(), REPO) == [], (
        "a class inherits from several project classes: make them parts it owns and delegates to")


@pytest.mark.unit
def test_the_check_finds_a_planted_mixin(tmp_path):
    package = tmp_path / "tablet"
    package.mkdir()
    (package / "parts.py").write_text("class Reads:\n    pass\n\n\nclass Replication:\n    pass\n")
    (package / "store.py").write_text(
        "import threading\n"
        "from tablet.parts import Reads, Replication\n"
        "from tablet import parts\n\n\n"
        "class Store(Reads, Replication):\n    pass\n\n\n"
        "class Qualified(parts.Reads, Replication):\n    pass\n\n\n"
        "class Composed(threading.Thread):\n    pass\n\n\n"
        "class One(Reads, threading.Thread):\n    pass\n")
    paths = sorted(package.glob("*.py"))
    assert mixed_classes(paths, tmp_path, ("tablet",)) == ["tablet.store:Store", "tablet.store:Qualified"]
