"""Fixtures of the benchmarks' tests."""

from __future__ import annotations

import tempfile

import pytest


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """An empty directory that the benchmark under test makes its temp directories in (``tempfile``'s), so
    that the test can check they are all gone at its end."""
    directory = tmp_path / "tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory
