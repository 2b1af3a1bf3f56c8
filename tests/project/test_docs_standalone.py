"""The project's docs stand alone: README.md and docs/*.md never send a reader outside the repository
(no ``../shared``, no design file of another repository), and every relative link in them reaches a file of the repository, and
a heading of it when the link names one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.support.paths import REPO

pytestmark = pytest.mark.unit

ROOT = REPO
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
#: what lies outside the repository: the shared folder, and the contract file kept there (its name is
#: assembled, so this file does not itself cite it)
OUTSIDE = ("../shared", "DESIGN" + ".md")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces to ``-``."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"#{1,6} (.+)", line)):
            base = slug(m.group(1))
            n = counts.get(base, 0)
            counts[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=_relative)
def test_a_doc_never_sends_readers_outside_the_repository(doc: Path):
    hits = [f"{_relative(doc)}:{number}: {line.strip()}"
            for number, line in enumerate(doc.read_text().splitlines(), 1)
            if any(word in line for word in OUTSIDE)]
    assert not hits, "say it in the project's words or link to docs/architecture.md:\n" + "\n".join(hits)


@pytest.mark.parametrize("doc", DOCS, ids=_relative)
def test_every_relative_link_reaches_a_file_and_heading_of_the_repository(doc: Path):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if not path.is_relative_to(ROOT) or not path.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: {_relative(path)} has no heading with the anchor #{anchor}")
    assert not broken, f"{_relative(doc)}:\n" + "\n".join(broken)


def test_slugs_are_githubs():
    assert slug("Snapshots and subsumption") == "snapshots-and-subsumption"
    assert slug("`kvlease lease acquire`: the JSON") == "kvlease-lease-acquire-the-json"
    assert slug("Leases — semantics") == "leases--semantics"
