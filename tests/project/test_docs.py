"""docs/configuration.md's configuration reference is the one generated from common/config.py."""

import pytest

from kvlease.common import config as cfg
from kvlease.ops import docs

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
