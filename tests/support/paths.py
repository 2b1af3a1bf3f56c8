"""Where things are, for tests in any sub-directory of tests/."""

from pathlib import Path

#: The repository's root (the directory with README.md).
REPO = Path(__file__).resolve().parents[2]
#: Recorded data files tests read (tests/support/fixtures/).
FIXTURES = Path(__file__).resolve().parent / "fixtures"
