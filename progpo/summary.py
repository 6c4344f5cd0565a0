"""The start-vs-end table printed at the end of `python -m progpo.train`."""

from __future__ import annotations

from collections.abc import Sequence


def summary_table(start: dict[str, float], end: dict[str, float], task_types: Sequence[str]) -> str:
    """Markdown table of held-out success per task type: warm start, end of RL, and the change (points)."""
    rows = [("all", "val/success")] + [(t, f"val/success/{t}") for t in task_types]
    lines = ["| task type | start | end | change (pts) |", "|---|---:|---:|---:|"]
    for name, key in rows:
        if key not in start and key not in end:
            continue
        a, b = start.get(key), end.get(key)
        change = f"{100 * (b - a):+.1f}" if a is not None and b is not None else "n/a"
        lines.append(f"| {name} | {_pct(a)} | {_pct(b)} | {change} |")
    if "val/score" in start or "val/score" in end:
        a, b = start.get("val/score"), end.get("val/score")
        change = f"{b - a:+.3f}" if a is not None and b is not None else "n/a"
        lines.append(f"| score (0-1) | {_num(a)} | {_num(b)} | {change} |")
    for key, label in (("val/episode_length", "episode length"), ("val/invalid_rate", "invalid-action rate")):
        if key in start or key in end:
            a, b = start.get(key), end.get(key)
            lines.append(f"| {label} | {_num(a)} | {_num(b)} | |")
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"
