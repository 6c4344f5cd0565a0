"""Progress bars: the one way the package shows how far a long loop is.

``progress_bar(...)`` takes tqdm's arguments. On a terminal (stderr is a TTY) it is an ordinary tqdm bar. Anywhere
else (a SLURM or CI log, a file, a pipe) it is a ``LogBar``: one plain newline-terminated line (description, n/total,
rate, elapsed, the postfix) at most every ``$PROGPO_PROGRESS_SECONDS`` seconds (default 30) while it advances short
of its total, and one final line when it closes, never a carriage return: a log holds a few readable lines instead of
a stream of redraws.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeAlias

from tqdm.auto import tqdm

__all__ = ["SECONDS_ENV", "Bar", "LogBar", "log_interval_s", "progress_bar"]

log = logging.getLogger(__name__)

SECONDS_ENV = "PROGPO_PROGRESS_SECONDS"
DEFAULT_SECONDS = 30.0


def log_interval_s() -> float:
    """Seconds between two lines of a ``LogBar``: ``$PROGPO_PROGRESS_SECONDS``, else 30."""
    raw = os.environ.get(SECONDS_ENV, "")
    if not raw.strip():
        return DEFAULT_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # also rejects nan
        log.warning("%s=%r is not a number of seconds >= 0; using %g", SECONDS_ENV, raw, DEFAULT_SECONDS)
        return DEFAULT_SECONDS
    return seconds


def _duration(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    h, m = divmod(minutes, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class LogBar:
    """A progress bar for logs: tqdm's interface as the package uses it (``update``, ``set_postfix``, ``close``,
    iteration, ``with``), written as whole lines (see the module doc). ``disable=True`` writes nothing."""

    def __init__(self, iterable: Iterable | None = None, desc: str | None = None, total: float | None = None,
                 initial: float = 0, unit: str = "it", disable: bool = False, file: IO[str] | None = None,
                 interval_s: float | None = None, **_tqdm_only: Any) -> None:
        # tqdm's drawing arguments (leave, mininterval, dynamic_ncols, ...) mean nothing in a log
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except (TypeError, AttributeError):
                total = None
        self.iterable, self.desc, self.total, self.unit = iterable, desc, total, unit
        self.n = self.initial = initial
        self.disable = disable
        self.file = file
        self.interval_s = log_interval_s() if interval_s is None else interval_s
        self.postfix: dict[str, Any] = {}
        self.start_t = self.last_print_t = time.monotonic()
        self.closed = False

    def __iter__(self) -> Iterator:
        if self.iterable is None:
            raise TypeError("this LogBar wraps no iterable")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __len__(self) -> int:
        return int(self.total or 0)

    def __enter__(self) -> LogBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n
        if self.disable or self.closed:
            return
        if self.total is not None and self.n >= self.total:
            return  # the closing line reports the end
        now = time.monotonic()
        if now - self.last_print_t >= self.interval_s:
            self._write(now)

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        self.postfix = {**(ordered_dict or {}), **kwargs}  # printed with the next line (``refresh`` is moot)

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc

    def refresh(self) -> None:
        """Nothing: a log line is due only by time (``update``) or at the end (``close``)."""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.disable:
            self._write(time.monotonic())

    def line(self, now: float | None = None) -> str:
        """The bar as one line: ``desc: n/total unit (p%), rate unit/s, elapsed mm:ss[, key=value ...]``."""
        elapsed = (time.monotonic() if now is None else now) - self.start_t
        n = f"{self.n:g}"
        parts = [f"{n}/{self.total:g} {self.unit}" if self.total else f"{n} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * self.n / self.total:.0f}%)"
        done = self.n - self.initial
        if elapsed > 0 and done > 0:
            rate = done / elapsed
            parts.append(f"{rate:,.2f} {self.unit}/s" if rate >= 1 else f"{1 / rate:,.2f} s/{self.unit}")
        parts.append(f"elapsed {_duration(elapsed)}")
        parts += [f"{k}={v}" for k, v in self.postfix.items()]
        return (f"{self.desc}: " if self.desc else "") + ", ".join(parts)

    def _write(self, now: float) -> None:
        out = self.file if self.file is not None else sys.stderr
        out.write(self.line(now) + "\n")
        out.flush()
        self.last_print_t = now


Bar: TypeAlias = "tqdm | LogBar"


def progress_bar(iterable: Iterable | None = None, *, tty: bool | None = None, **kwargs: Any) -> Bar:
    """A tqdm bar on a terminal, a ``LogBar`` elsewhere (see the module doc); takes tqdm's arguments.

    ``tty``: whether stderr counts as a terminal (None: ask ``sys.stderr.isatty()``).
    """
    if tty is None:
        tty = _stderr_is_tty()
    return tqdm(iterable, **kwargs) if tty else LogBar(iterable, **kwargs)


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False
