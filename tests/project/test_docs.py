"""Generated docs: docs/configuration.md's reference is common/config.py's; README's performance table is the recorded run's."""

import json

import pytest

from kvlease.common import config as cfg
from kvlease.ops import docs
from kvlease.ops.bench import readme_table, suite

pytestmark = pytest.mark.unit


def test_the_config_page_matches_the_code():
    page = docs.CONFIG_PAGE.read_text()
    assert docs.render(page) == page, "docs/configuration.md is stale: run `python -m kvlease.ops.docs`"


def test_the_readme_leaves_the_config_reference_to_its_page():
    assert docs.BEGIN not in docs.README.read_text()
    assert "docs/configuration.md" in docs.README.read_text()


def test_every_key_is_documented_with_its_default_and_env_var():
    reference = docs.config_reference()
    for key in cfg.KEYS.values():
        assert key.doc, f"config key {key.name} has no doc"
        assert f"| `{key.name}` |" in reference and key.env_var in reference


def test_a_changed_key_makes_the_page_stale(tmp_path):
    page = tmp_path / "configuration.md"
    stale = docs.render(f"x\n{docs.BEGIN}\n{docs.END}\ny\n").replace("`6s`", "`7s`")
    page.write_text(stale)
    assert docs.main(["--check", "--page", str(page)]) == 1
    assert docs.main(["--page", str(page)]) == 0
    assert "`6s`" in page.read_text() and docs.main(["--check", "--page", str(page)]) == 0


def test_a_page_without_markers_is_an_error(tmp_path):
    page = tmp_path / "configuration.md"
    page.write_text("no markers\n")
    assert docs.main(["--check", "--page", str(page)]) == 1


def test_the_readme_performance_table_is_the_recorded_run():
    doc = json.loads(readme_table.RESULTS.read_text())
    page = readme_table.README.read_text()
    assert readme_table.render(page, doc) == page, (
        "README.md's performance table is not docs/bench-all.json: run `python -m kvlease.ops.bench.readme_table`")
    assert set(doc["benchmarks"]) == set(suite.SUITE), "docs/bench-all.json is not a run of every benchmark"


def test_a_changed_figure_makes_the_readme_table_stale(tmp_path):
    doc = json.loads(readme_table.RESULTS.read_text())
    page, results = tmp_path / "README.md", tmp_path / "bench-all.json"
    page.write_text(f"# x\n{readme_table.BEGIN}\n{readme_table.END}\nrest\n")
    results.write_text(json.dumps(doc))
    args = ["--page", str(page), "--results", str(results)]
    assert readme_table.main([*args, "--check"]) == 1
    assert readme_table.main(args) == 0 and readme_table.main([*args, "--check"]) == 0
    first = next(entry for entry in doc["benchmarks"].values() if "rows" in entry)["rows"][0]
    first.update(measured=first["measured"] * 3 + 1)
    results.write_text(json.dumps(doc))
    assert readme_table.main([*args, "--check"]) == 1
    assert readme_table.main(args) == 0 and page.read_text().endswith("\nrest\n")


def test_a_failed_benchmark_is_a_row_that_says_so():
    doc = {"machine": {}, "benchmarks": {"rebuild": {"options": {}, "error": "RuntimeError: a|b"}}}
    assert "| rebuild | failed: RuntimeError: a\\|b | | | | | NO |" in readme_table.markdown(doc)
