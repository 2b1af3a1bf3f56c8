"""``make test``'s ``--dist loadgroup`` keeps a group on one worker: the shared clusters and SparkSessions of
tests/conftest.py rest on it. pytest 9.2 with pytest-xdist 3.8 silently spread every group over all workers
(xdist renames a grouped test by a field pytest 9.2 no longer reads), starting a SparkSession and each
module's cluster once per worker; this runs a small session of its own and checks where its tests ran."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

GROUPED = textwrap.dedent("""
    import os

    import pytest

    @pytest.mark.xdist_group("one")
    @pytest.mark.parametrize("n", range(6))
    def test_grouped(n):
        with open(os.environ["WHERE"], "a") as f:
            f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
""")


def test_a_group_runs_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    where = tmp_path / "where.txt"
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "-n", "3", "--dist", "loadgroup", "-c", "/dev/null", "--rootdir", str(tmp_path),
                          str(tmp_path)], cwd=tmp_path, env={**_env(), "WHERE": str(where)},
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    workers = where.read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
