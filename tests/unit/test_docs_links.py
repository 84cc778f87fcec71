"""The docs' links lead somewhere: every relative link in README.md, ARCHITECTURE.md, BENCHMARKS.md and docs/ names
a file of the repository, and every ``#anchor`` a heading of the page it points into (GitHub's anchors: the heading
in lower case, punctuation but hyphens dropped, spaces as hyphens). Pages moved or headings renamed break links
silently otherwise."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(page: pathlib.Path) -> set[str]:
    """The anchors GitHub gives the page's headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for line in _FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        if not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(page: pathlib.Path) -> list[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return [m.group("target") for m in _LINK.finditer(text) if not re.match(r"[a-z]+:", m.group("target"))]


def test_the_anchor_rule_is_githubs():
    page = ROOT / "docs" / "operations.md"
    assert {"prefilldecode-disaggregation", "behind-a-balancer-what-takes-a-node-out"} <= anchors(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_a_heading(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        into = (page.parent / path).resolve() if path else page
        if not into.exists():
            broken.append(f"{target}: no such file")
        elif anchor and into.suffix == ".md" and anchor not in anchors(into):
            broken.append(f"{target}: no heading '{anchor}' in {into.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
