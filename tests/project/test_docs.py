"""The README's configuration reference is the one generated from common/config.py."""

import pytest

from common import config as cfg
from ops import docs

pytestmark = pytest.mark.unit


def test_the_readme_config_reference_matches_the_code():
    readme = docs.README.read_text()
    assert docs.render(readme) == readme, "README config reference is stale: run `python -m ops.docs`"


def test_every_key_is_documented_with_its_default_and_env_var():
    reference = docs.config_reference()
    for key in cfg.KEYS.values():
        assert key.doc, f"config key {key.name} has no doc"
        assert f"| `{key.name}` |" in reference and key.env_var in reference


def test_a_changed_key_makes_the_readme_stale(tmp_path):
    readme = tmp_path / "README.md"
    stale = docs.render(f"x\n{docs.BEGIN}\n{docs.END}\ny\n").replace("`6s`", "`7s`")
    readme.write_text(stale)
    assert docs.main(["--check", "--readme", str(readme)]) == 1
    assert docs.main(["--readme", str(readme)]) == 0
    assert "`6s`" in readme.read_text() and docs.main(["--check", "--readme", str(readme)]) == 0


def test_a_readme_without_markers_is_an_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    assert docs.main(["--check", "--readme", str(readme)]) == 1
