"""README.md stays a page a newcomer reads in five minutes, it maps every page of docs/,
and every relative link in README.md and docs/*.md resolves: the file exists and, for
``#anchor`` links, a heading on that page has that anchor (GitHub's slugs).

Pages move and headings get renamed; a link that silently stops pointing anywhere is what
this keeps from happening.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]

README_MAX_LINES = 200
"""Read in five minutes: the rest belongs on a docs page."""

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^()\s]+)\)")
_HEADING = re.compile(r"(#{1,6}) +(.*?) *#*$")


def _prose(text: str) -> Iterator[str]:
    """``text``'s lines outside fenced code blocks, inline code spans blanked out."""
    inside = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
            continue
        if not inside:
            yield re.sub(r"`[^`]*`", "``", line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lower case, punctuation but ``-`` and ``_``
    dropped, each space a ``-``.

    Raises:
        ValueError: the heading is blank (GitHub gives it no anchor).
    """
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link: its label
    anchor = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
    if not anchor:
        raise ValueError(f"heading {heading!r} has no anchor")
    return anchor


def anchors(page: Path) -> set[str]:
    """Every heading anchor on ``page``, a repeated one numbered as GitHub does (-1, -2)."""
    seen: dict[str, int] = {}
    found = set()
    inside = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
            continue
        match = None if inside else _HEADING.fullmatch(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    """The relative link targets in ``page``'s prose (not URLs, not code)."""
    targets = []
    for line in _prose(page.read_text()):
        for target in _LINK.findall(line):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto: ...
                targets.append(target)
    return targets


LINKS = [
    pytest.param(page, target, id=f"{page.relative_to(REPO)} -> {target}")
    for page in PAGES
    for target in links(page)
]


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines < README_MAX_LINES, f"README.md has {lines} lines: move detail to docs/"


def test_the_readme_maps_every_docs_page() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README)}
    missing = [page.name for page in DOCS if page.resolve() not in linked]
    assert not missing, f"README.md links no docs/{missing}"


def test_the_readme_links_docs_pages_that_exist() -> None:
    to_docs = [t for t in links(README) if t.startswith("docs/")]
    assert len(to_docs) >= len(DOCS)
    for target in to_docs:
        assert (REPO / target.partition("#")[0]).is_file(), f"README.md -> {target}"


def test_there_are_links_to_check() -> None:
    assert len(LINKS) >= 50


@pytest.mark.parametrize(("page", "target"), LINKS)
def test_a_relative_link_resolves(page: Path, target: str) -> None:
    path, _, anchor = target.partition("#")
    where = (page.parent / path).resolve() if path else page
    assert where.exists(), f"{page.relative_to(REPO)}: {target}: no {path}"
    if anchor:
        assert where.suffix == ".md", f"{page.relative_to(REPO)}: {target}: anchor in a non-page"
        assert anchor in anchors(where), (
            f"{page.relative_to(REPO)}: {target}: no heading #{anchor} in {where.name}"
        )


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("P4Runtime over mutual TLS", "p4runtime-over-mutual-tls"),
        ("`inalab decide`: which allreduce algorithm, and why",
         "inalab-decide-which-allreduce-algorithm-and-why"),
        ("The agent inside a training job: `examples/train_mixed.py`",
         "the-agent-inside-a-training-job-examplestrain_mixedpy"),
        ("Run your own program: `inalab emulate TOPOLOGY run -- COMMAND`",
         "run-your-own-program-inalab-emulate-topology-run----command"),
        ("2026-11-28: 1 Gbit/s (ring)", "2026-11-28-1-gbits-ring"),
    ],
)  # fmt: skip
def test_slugs_are_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_repeated_heading_is_numbered(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# A\n\n## Notes\n\n```\n# not a heading\n```\n\n## Notes\n")
    assert anchors(page) == {"a", "notes", "notes-1"}
