"""The design of record ships in the repo (``docs/design.md``), and every citation of it in the
code and the docs names a section that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CITED = re.compile(r"docs/design\.md((?:,? ?§\d+)+)")
SECTION = re.compile(r"^## (\d+)\. ", re.MULTILINE)
SOURCES = ("fsobs", "optim", "dashboard", "tests", "benchmarks", "examples", "traces")


def _texts() -> dict[Path, str]:
    paths = [p for top in SOURCES for p in (ROOT / top).rglob("*") if p.suffix in {".py", ".md"}]
    paths += [ROOT / "README.md", ROOT / "BENCHMARKS.md"]
    return {p: p.read_text(encoding="utf-8") for p in paths if p.is_file()}


def test_every_citation_names_a_section_of_the_design() -> None:
    sections = set(SECTION.findall((ROOT / "docs" / "design.md").read_text(encoding="utf-8")))
    assert {"3", "4", "5", "6", "7"} <= sections  # the sections the code cites most
    cited = {
        (path.relative_to(ROOT).as_posix(), number)
        for path, text in _texts().items()
        for match in CITED.finditer(text)
        for number in re.findall(r"\d+", match.group(1))
    }
    assert len(cited) >= 20  # the citations exist and the pattern finds them
    assert sorted(c for c in cited if c[1] not in sections) == []


def test_no_citation_points_outside_the_repo() -> None:
    """The blueprint in the team's shared folder is not the design of record."""
    stale = re.compile(r"\bDESIGN(?: §|\.md)")
    assert (
        sorted(p.relative_to(ROOT).as_posix() for p, t in _texts().items() if stale.search(t)) == []
    )
