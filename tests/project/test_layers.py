"""The import graph follows the layers (docs/architecture.md, "Code layers") and has no cycle.

Every import of the project goes through its one top-level package: ``kvlease.common``, ``kvlease.tablet``…
(the folders are sub-packages of ``kvlease`` once installed, ``setup.py``), never a bare ``common``. The
graph below names modules without that prefix (``tablet.log.changelog``).

Layers, lowest first: ``common``; then ``leases`` (the lease domain) and
``client`` (what a user process needs), and ``kvlease``, which only
re-exports the client; then the servers, ``coordinator``
and ``tablet``, which may use the client; then ``spark_source``, which uses
only the client; then ``ops``, which uses the client and (for the demo and
the bootstrap benchmark, as a user would) ``spark_source``. Nothing imports
``ops``; only ``ops`` imports ``spark_source``. One module of ``ops`` may use
the lease domain: ``ops.bench.seed`` writes leases as the coordinator's store does. One may run a
tablet server: ``ops.bench.rebuild`` starts the rebuilt follower in its own process (its rebuild timed
without an interpreter's start, its applied offset and rebuild count read directly).

Inside ``client``, one module is the tablet servers' alone: ``client.server_calls`` (the coordinator calls
only a tablet server makes: ISR changes, controlled shutdown, loss reports) is imported by ``tablet`` only,
never by what users run (``kvlease``, ``spark_source``, ``ops``) nor by the rest of the client.

Inside ``ops``, each sub-package (``ops.cli``, ``ops.local_cluster``,
``ops.drills``, ``ops.bench``, ``ops.demo``, ``ops.streaming``) is one concept: another
sub-package imports it only through its public module, the package itself.
``ops.demo`` and ``ops.drills`` do not import each other at all: what both
use is in ``ops.check`` (a check) and ``ops.streaming`` (the Spark query and
its checkers).

Inside ``tablet``, each sub-package is one concept and they stack, lowest first: ``tablet.log``, then
``tablet.store``, ``tablet.bucket``, ``tablet.replication``, ``tablet.replicas``, ``tablet.scan``
(:data:`TABLET_ROOMS`: what each may import of the rest of ``tablet``); the modules at the top of
``tablet`` (the process: server, service) may import any of them. Each sub-package's ``__init__`` says
what it holds and, in a line ``May import …``, the same list.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.paths import REPO

ROOT = REPO
PACKAGES = ("common", "leases", "client", "kvlease", "coordinator", "tablet", "ops", "spark_source")
#: package -> the packages it may import (besides itself)
ALLOWED = {
    "common": set(),
    "leases": {"common"},
    "client": {"common"},
    "kvlease": {"common", "client"},  # the library's front door: re-exports of the client
    "coordinator": {"common", "leases", "client"},
    "tablet": {"common", "client"},
    "ops": {"common", "client", "spark_source"},
    "spark_source": {"common", "client"},
}
#: module -> further packages it alone may import
ALLOWED_MODULES = {"ops.bench.seed": {"leases"}, "ops.bench.rebuild": {"tablet"},
                   "kvlease.__main__": {"ops"}}  # ``python -m kvlease``: the CLI
OPS_ROOMS = ("ops.cli", "ops.local_cluster", "ops.drills", "ops.bench", "ops.demo", "ops.streaming")
#: ops sub-packages that may not import each other in either direction
APART = (("ops.demo", "ops.drills"),)
#: module -> the only packages that may import it
SERVER_ONLY = {"client.server_calls": {"tablet"}}
#: tablet sub-package -> the other parts of ``tablet`` it may import
TABLET_ROOMS = {
    "tablet.log": set(),
    "tablet.store": {"tablet.log"},
    "tablet.bucket": {"tablet.log", "tablet.store"},
    "tablet.replication": {"tablet.log", "tablet.store", "tablet.bucket", "tablet.periodic"},
    "tablet.replicas": {"tablet.log", "tablet.store", "tablet.bucket", "tablet.replication", "tablet.periodic"},
    "tablet.scan": {"tablet.store", "tablet.bucket", "tablet.replicas", "tablet.authz"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported_names(node: ast.AST) -> list[str]:
    """The dotted names an import statement may bind (a ``from`` import: the module and each module.name)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
    return []


@functools.lru_cache(maxsize=None)
def _imports(path: Path) -> tuple[ast.AST, ...]:
    """The import statements of the file at ``path``, anywhere in it (parsed once for all the tests here)."""
    return tuple(node for node in ast.walk(ast.parse(path.read_text(), str(path)))
                 if isinstance(node, (ast.Import, ast.ImportFrom)))


def bare_imports(modules: dict[str, Path] | None = None) -> list[str]:
    """Every import of a project package without the ``kvlease.`` prefix (``from common.x import y``)."""
    folders = set(PACKAGES) - {"kvlease"}
    return [f"{name}: {node.module if isinstance(node, ast.ImportFrom) else node.names[0].name}"
            for name, path in (modules or _modules()).items()
            for node in _imports(path)
            if (names := _imported_names(node)) and names[-1].split(".")[0] in folders]


@functools.lru_cache(maxsize=None)
def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its body (also inside functions); made once (the
    tests only read it)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in _imports(path):
            candidates = [c.removeprefix("kvlease.") if c.split(".")[1:2] and c.split(".")[1] in PACKAGES else c
                          for c in _imported_names(node)]
            if not candidates:
                continue
            for candidate in candidates:
                if candidate in modules:
                    targets.add(candidate)
                elif candidate.rsplit(".", 1)[0] in modules and isinstance(node, ast.ImportFrom):
                    targets.add(candidate.rsplit(".", 1)[0])
        graph[name] = targets - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a package that its layer does not allow."""
    return [f"{module} imports {target}" for module, targets in sorted(graph.items()) for target in sorted(targets)
            if target.split(".")[0] != module.split(".")[0]
            and target.split(".")[0] not in ALLOWED[module.split(".")[0]] | ALLOWED_MODULES.get(module, set())]


def server_only_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a :data:`SERVER_ONLY` module by a package not named for it."""
    return [f"{module} imports {target}" for module, targets in sorted(graph.items()) for target in sorted(targets)
            if target in SERVER_ONLY and module.split(".")[0] not in SERVER_ONLY[target]]


def _room(module: str) -> str | None:
    return next((room for room in OPS_ROOMS if module == room or module.startswith(room + ".")), None)


def room_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of another ops sub-package's internals (anything but the sub-package itself)."""
    return [f"{module} imports {target}" for module, targets in sorted(graph.items()) for target in sorted(targets)
            if _room(target) is not None and _room(target) != _room(module) and target != _room(target)]


def apart_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import between two ops sub-packages of :data:`APART` (in either direction)."""
    pairs = {frozenset(pair) for pair in APART}
    return [f"{module} imports {target}" for module, targets in sorted(graph.items()) for target in sorted(targets)
            if _room(module) != _room(target) and frozenset((_room(module), _room(target))) in pairs]


def _tablet_part(module: str) -> str | None:
    """The sub-package of ``tablet`` (or top-level module of it) ``module`` belongs to."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "tablet" and len(parts) > 1 else None


def tablet_room_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import by a :data:`TABLET_ROOMS` sub-package of a part of ``tablet`` it may not import."""
    return [f"{module} imports {target}" for module, targets in sorted(graph.items()) for target in sorted(targets)
            if (room := _tablet_part(module)) in TABLET_ROOMS and (part := _tablet_part(target)) is not None
            and part != room and part not in TABLET_ROOMS[room]]


@pytest.mark.unit
def test_tablet_sub_packages_import_only_the_rooms_below_them():
    assert tablet_room_violations(import_graph()) == []


@pytest.mark.unit
def test_each_tablet_sub_package_says_what_it_holds_and_may_import():
    for room, allowed in TABLET_ROOMS.items():
        init = ROOT / room.replace(".", "/") / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        stated = doc.split("May import", 1)[1] if "May import" in doc else " nothing"
        said = {f"tablet.{name}" for name in re.findall(r"``tablet\.(\w+)``", stated)}
        assert said == allowed, f"{init}: its 'May import' line names {sorted(said)}, the rule {sorted(allowed)}"
        assert len(doc.split("May import", 1)[0]) > 200, f"{init} does not say what it holds"


@pytest.mark.unit
def test_every_import_goes_through_the_kvlease_package():
    assert bare_imports() == []


@pytest.mark.unit
def test_every_import_follows_the_layers():
    assert layer_violations(import_graph()) == []


@pytest.mark.unit
def test_only_tablet_servers_import_their_own_coordinator_calls():
    graph = import_graph()
    assert "client.server_calls" in graph["tablet.server"]  # the rule watches a real import
    assert server_only_violations(graph) == []
    planted = {"ops.cli.app": {"client.server_calls"}, "spark_source.reader": {"client.server_calls"},
               "tablet.server": {"client.server_calls"}}
    assert server_only_violations(planted) == ["ops.cli.app imports client.server_calls",
                                               "spark_source.reader imports client.server_calls"]


@pytest.mark.unit
def test_ops_sub_packages_import_each_other_only_through_their_public_module():
    graph = import_graph()
    assert all(any(_room(m) == room for m in graph) for room in OPS_ROOMS)  # every room exists
    assert room_violations(graph) == []


@pytest.mark.unit
def test_the_demo_and_the_drills_do_not_import_each_other():
    assert apart_violations(import_graph()) == []


@pytest.mark.unit
def test_the_import_graph_has_no_cycle():
    assert find_cycle(import_graph()) is None


@pytest.mark.unit
def test_the_bare_import_check_sees_a_planted_one(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import os\nfrom kvlease.common import config\n\ndef f():\n    from tablet.log import index\n")
    assert bare_imports({"ops.planted": planted}) == ["ops.planted: tablet.log"]


@pytest.mark.unit
def test_the_checks_see_a_planted_violation():
    graph = {"client.a": {"client.b"}, "client.b": {"tablet.x", "client.a"}, "tablet.x": set(),
             "common.y": {"leases.z"}, "leases.z": set()}
    assert find_cycle(graph) == ["client.a", "client.b", "client.a"]
    assert layer_violations(graph) == ["client.b imports tablet.x", "common.y imports leases.z"]
    rooms = {"ops.drills.chaos": {"ops.demo", "ops.demo.spark", "ops.drills.report"}, "ops.cli.app": {"ops.cli.output"},
             "ops.docs": {"ops.cli.output"}, "ops.bench.scan": {"leases.store"}}
    assert room_violations(rooms) == ["ops.docs imports ops.cli.output", "ops.drills.chaos imports ops.demo.spark"]
    assert layer_violations(rooms) == ["ops.bench.scan imports leases.store"]
    assert layer_violations({"ops.bench.seed": {"leases.store"}}) == []
    apart = {"ops.demo.lifecycle": {"ops.drills", "ops.streaming", "ops.check"}, "ops.drills.chaos": {"ops.demo"},
             "ops.drills.all": {"ops.drills.report"}, "ops.bench.scan": {"ops.drills"}}
    assert apart_violations(apart) == ["ops.demo.lifecycle imports ops.drills", "ops.drills.chaos imports ops.demo"]
    tablet = {"tablet.log.changelog": {"tablet.store.kvstore"}, "tablet.store.snapshot": {"tablet.log.changelog"},
              "tablet.bucket.reads": {"tablet.scan.batch", "tablet.bucket.state"}, "tablet.server": {"tablet.scan.service"}}
    assert tablet_room_violations(tablet) == ["tablet.bucket.reads imports tablet.scan.batch",
                                              "tablet.log.changelog imports tablet.store.kvstore"]
    assert any("client.table" in targets for targets in import_graph().values())  # the graph is not empty


@pytest.mark.unit
def test_the_client_package_imports_without_any_server_package():
    """Every client module imports in a fresh interpreter where the server packages cannot be imported."""
    client_modules = sorted(m for m in _modules() if m.split(".")[0] == "client")
    code = "\n".join([
        "import importlib, sys",
        "for blocked in ('tablet', 'coordinator', 'leases', 'ops', 'spark_source'):",
        "    sys.modules[blocked] = None  # any import of it raises ImportError",
        f"for name in {client_modules!r}:",
        "    importlib.import_module(name)",
        "print('ok', len(sys.modules))",
    ])
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")
