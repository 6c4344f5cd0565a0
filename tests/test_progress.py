"""Progress bars (``progpo.progress``): plain lines in a log, an ordinary tqdm bar on a terminal, one module for both."""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tqdm.auto import tqdm

from progpo.progress import SECONDS_ENV, LogBar, log_interval_s, progress_bar

REPO = Path(__file__).resolve().parents[1]

LOOP = """
import time
from progpo.progress import progress_bar
with progress_bar(total=30, desc="work", unit="ep", leave=False, mininterval=5) as bar:
    for i in range(30):
        time.sleep(0.01)
        bar.update(1)
        bar.set_postfix(step=i, refresh=False)
for _ in progress_bar(range(7), desc="iterable"):
    pass
"""


def _run_loop(stderr, seconds: str) -> subprocess.CompletedProcess:
    env = {**os.environ, SECONDS_ENV: seconds, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", LOOP], stderr=stderr, stdout=subprocess.DEVNULL, env=env,
                          timeout=120, cwd=REPO)


def test_off_a_terminal_a_bar_writes_plain_lines(tmp_path):
    log = tmp_path / "stderr.log"
    with log.open("w") as fh:
        assert _run_loop(fh, "0.05").returncode == 0
    text = log.read_text()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    work = [line for line in lines if line.startswith("work: ")]
    assert 2 <= len(work) < 30  # some lines while it runs (every 0.05 s), not one per update
    assert work[-1].startswith("work: 30/30 ep (100%)") and "elapsed 00:00" in work[-1] and "step=29" in work[-1]
    assert sum("30/30" in line for line in work) == 1  # the last update leaves the end to the closing line
    assert lines[-1].startswith("iterable: 7/7 it (100%)")  # the final line of a wrapped iterable


def test_off_a_terminal_a_short_bar_writes_one_line(tmp_path):
    log = tmp_path / "stderr.log"
    with log.open("w") as fh:
        assert _run_loop(fh, "30").returncode == 0
    lines = log.read_text().splitlines()
    assert [line.split(",")[0] for line in lines] == ["work: 30/30 ep (100%)", "iterable: 7/7 it (100%)"]


@pytest.mark.skipif(not hasattr(os, "openpty") or sys.platform == "win32", reason="needs a pseudo-terminal")
def test_on_a_terminal_a_bar_is_tqdm(tmp_path):
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 0-column terminal hides tqdm
    try:
        assert _run_loop(slave, "0").returncode == 0
        os.close(slave)
        slave = -1
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO once the terminal's other end is closed and drained
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert b"\r" in out and b"work:" in out and b"|" in out  # tqdm's redrawn bar


def test_the_terminal_decision_can_be_forced():
    assert isinstance(progress_bar(total=3, tty=False, file=io.StringIO()), LogBar)
    out = io.StringIO()
    bar = progress_bar(total=3, tty=True, file=out, desc="tty")
    assert isinstance(bar, tqdm)
    bar.update(3)
    bar.close()
    assert "\r" in out.getvalue() and "3/3" in out.getvalue()


def test_a_disabled_log_bar_writes_nothing():
    out = io.StringIO()
    with progress_bar(total=5, tty=False, file=out, disable=True, interval_s=0) as bar:
        for _ in range(5):
            bar.update(1)
    assert out.getvalue() == "" and bar.n == 5


def test_the_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(SECONDS_ENV, raising=False)
    assert log_interval_s() == 30
    monkeypatch.setenv(SECONDS_ENV, "2.5")
    assert log_interval_s() == 2.5
    monkeypatch.setenv(SECONDS_ENV, "soon")
    assert log_interval_s() == 30  # not a number: the default, with a warning


def test_only_the_progress_module_imports_tqdm():
    importers = []
    for path in sorted((REPO / "progpo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "tqdm" or n.startswith("tqdm.") for n in names):
                importers.append(str(path.relative_to(REPO)))
    assert sorted(set(importers)) == ["progpo/progress.py"], "use progpo.progress.progress_bar instead of tqdm"
