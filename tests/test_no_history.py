"""The product holds no work history: numbered issues, sessions or rounds belong to git, not to code, config or docs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HISTORY = re.compile(r"\b(issue|session|round) #?\d+|\bsuperseded\b|\bearlier round\b", re.IGNORECASE)
SOURCES = ("README.md", "progpo/**/*.py", "envs/**/*.py", "tests/**/*.py", "conf/**/*.yaml", "sweeps/**/*.yaml",
           "docs/**/*.md", "scripts/**/*", "docker/**/*", "Makefile", "pyproject.toml")


def test_no_work_history_in_the_tree():
    me = Path(__file__).resolve()
    hits = []
    for pattern in SOURCES:
        for path in REPO.glob(pattern):
            if not path.is_file() or path.resolve() == me:
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if HISTORY.search(line):
                    hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:120]}")
    assert not hits, "work history in the tree (git keeps it):\n" + "\n".join(hits)
