"""The installed distribution has one top-level package, ``kvlease``, and runs from it.

The wheel is built from the repository's files (copied, so the build leaves nothing in the checkout) and
installed, without its dependencies, into a fresh venv; the dependencies come from this venv's
site-packages on ``PYTHONPATH`` (which, unlike a site dir, runs no ``.pth`` file: this checkout's
editable install stays out of it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from tests.support.paths import REPO

pytestmark = pytest.mark.slow

TIMEOUT_S = 120  # each step; subprocess.run kills what overruns it


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp / "dist"), str(source)], check=True, capture_output=True, text=True, timeout=TIMEOUT_S)
    (built,) = (tmp / "dist").glob("kvlease-*.whl")
    return built


def test_kvlease_is_the_only_top_level_package(wheel):
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/", 1)[0] for name in archive.namelist()}
        names = set(archive.namelist())
    assert {top for top in tops if not top.endswith(".dist-info")} == {"kvlease"}
    for module in ("kvlease/common/config.py", "kvlease/tablet/log/changelog.py", "kvlease/ops/cli/app.py",
                   "kvlease/common/proto/tablet.proto", "kvlease/client/py.typed"):
        assert module in names, module


def test_the_installed_wheel_imports_and_runs_from_kvlease(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=TIMEOUT_S)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, text=True, timeout=TIMEOUT_S)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    probe = ("import kvlease, kvlease.tablet.server, kvlease.coordinator.server, kvlease.spark_source;"
             "print(kvlease.__file__); print(kvlease.connect.__module__)")
    out = subprocess.run([str(python), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stderr
    where, connect_module = out.stdout.split()
    assert Path(where).is_relative_to(venv) and connect_module == "kvlease.client.connect"
    for command in (["-m", "kvlease.tablet", "--help"], ["-m", "kvlease", "--help"]):
        ran = subprocess.run([str(python), *command], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=TIMEOUT_S)
        assert ran.returncode == 0, (command, ran.stderr)
    bare = subprocess.run([str(python), "-c", "import common"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert "No module named 'common'" in bare.stderr  # nothing of ours outside kvlease
