"""The choice of stray bucket copies (tablet/replicas/stray_copies.py): pure, no ZooKeeper."""

from __future__ import annotations

import pytest

from kvlease.common import errors
from kvlease.tablet.replicas.stray_copies import bucket_dirs, choose_strays


def test_only_unheld_buckets_of_existing_tables_are_strays():
    on_disk = [(7, 0), (7, 1), (8, 0), (9, 2)]
    asked = []

    def exists(table_id):
        asked.append(table_id)
        return table_id != 9  # table 9 was dropped: remove_dropped_tables' business, not a stray

    choice = choose_strays(on_disk, held={(7, 0), (8, 0)}, table_exists=exists)
    assert choice.strays == ((7, 1),)
    assert choice.unchecked == ()
    assert asked == [7, 9]  # table 8 has no unheld directory: ZooKeeper is not asked


def test_a_bucket_refused_for_capacity_counts_as_held():
    choice = choose_strays([(3, 0), (3, 1)], held={(3, 0), (3, 1)}, table_exists=lambda t: True)
    assert choice.strays == ()


def test_a_table_zookeeper_cannot_answer_for_keeps_its_directories():
    def exists(table_id):
        if table_id == 5:
            raise errors.NetworkError("cannot learn from ZooKeeper whether table 5 exists")
        return True

    choice = choose_strays([(5, 0), (5, 3), (6, 1)], held=set(), table_exists=exists)
    assert choice.strays == ((6, 1),)
    assert choice.unchecked == (5,)


def test_an_unexpected_error_is_not_taken_for_an_answer():
    def exists(table_id):
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError):
        choose_strays([(1, 0)], held=set(), table_exists=exists)


def test_bucket_dirs_lists_numeric_table_and_bucket_directories_only(tmp_path):
    for path in ("7/0", "7/12", "7/not-a-bucket", "8/1", "held", "notes/0"):
        (tmp_path / path).mkdir(parents=True)
    (tmp_path / "server.json").write_text("{}")
    (tmp_path / "9").write_text("a file, not a table dir")
    (tmp_path / "8" / "3").write_text("a file, not a bucket dir")
    assert bucket_dirs(str(tmp_path)) == [(7, 0), (7, 12), (8, 1)]
    assert bucket_dirs(str(tmp_path / "missing")) == []
