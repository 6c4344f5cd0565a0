"""Every relative link of the README and the docs points at a file that exists, and every README anchor at a heading."""

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


def test_relative_links_resolve():
    broken = []
    for doc in _documents():
        for target in LINK.findall(doc.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = (doc.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target}")
    assert not broken, "\n".join(broken)


def test_readme_anchors_name_headings():
    text = (REPO / "README.md").read_text()
    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}
    anchors |= set(re.findall(r'<a id="([^"]+)"', text))
    missing = [a for a in re.findall(r"\]\(#([^)]+)\)", text) if a not in anchors]
    assert not missing, missing
