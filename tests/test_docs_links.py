"""Every relative link of the README and the docs points at a file that exists, and every anchor at a heading."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _anchors(doc: Path) -> set[str]:
    text = doc.read_text()
    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}
    return anchors | set(re.findall(r'<a id="([^"]+)"', text))


def _links(doc: Path) -> list[tuple[str, Path, str]]:
    """(link as written, file it points at, anchor or '') for every relative link of ``doc``."""
    out = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        out.append((target, (doc.parent / path).resolve() if path else doc, anchor))
    return out


def test_relative_links_resolve():
    broken = [f"{doc.relative_to(REPO)}: {target}" for doc in _documents()
              for target, path, _ in _links(doc) if not path.exists()]
    assert not broken, "\n".join(broken)


def test_anchors_name_headings():
    missing = [f"{doc.relative_to(REPO)}: {target}" for doc in _documents()
               for target, path, anchor in _links(doc)
               if anchor and path.suffix == ".md" and path.exists() and anchor not in _anchors(path)]
    assert not missing, "\n".join(missing)


def test_readme_stays_a_guide():
    """The README is read in minutes: results and narratives live on their own pages under docs/."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail to docs/guide or docs/results"
