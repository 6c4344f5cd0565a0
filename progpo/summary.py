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


_PHASE_LABELS = {"rollout": "rollout", "score": "scoring", "credit": "credit", "update": "update",
                 "sync": "weight sync"}


def time_table(rows: Sequence[dict[str, float]], build_s: float, total_s: float) -> str:
    """Markdown table of where a run's wall clock went: build, held-out evaluation, RL iterations by phase, the rest.

    ``rows``: the metric rows this process logged (an iteration's carry ``perf/<phase>_s``, an evaluation's
    ``perf/val_rollout_s``); ``build_s``: ``build``'s seconds; ``total_s``: from ``build``'s start to the summary.
    "the rest" is what no phase timed: checkpoints, logging, plots, Lightning's loop.
    """
    evals = [row["perf/val_rollout_s"] for row in rows if "perf/val_rollout_s" in row]
    iterations = [row for row in rows if "perf/rollout_s" in row]
    phases: dict[str, float] = {}
    for row in iterations:
        for key, value in row.items():
            if key.startswith("perf/") and key.endswith("_s") and not key.endswith("_per_s"):  # not throughputs
                phase = key[len("perf/"):-len("_s")]
                phases[phase] = phases.get(phase, 0.0) + value
    iterations_s = sum(phases.values())
    rest = total_s - build_s - sum(evals) - iterations_s

    def line(label: str, seconds: float) -> str:
        share = f"{100 * seconds / total_s:.0f}%" if total_s > 0 else "n/a"
        return f"| {label} | {seconds:.1f} | {share} |"

    lines = ["| time | seconds | share |", "|---|---:|---:|",
             line("build (tracking store, env suite, model, engine)", build_s)]
    if evals:
        lines.append(line(f"held-out evaluation ({len(evals)})", sum(evals)))
    if iterations:
        lines.append(line(f"RL iterations ({len(iterations)})", iterations_s))
        lines += [line(f"- {_PHASE_LABELS.get(phase, phase)}", seconds) for phase, seconds in phases.items()
                  if seconds > 0]
    lines += [line("checkpoints, logging, plots, the rest", rest), line("**total** (build to summary)", total_s)]
    return "\n".join(lines)
