"""The GPU check's table, from each run's ``metrics.jsonl`` and its ``<name>.mem`` log (nvidia-smi MiB samples).

    python tests/gpu/table.py RUNS_DIR NAME [NAME ...] [--note NAME=TEXT ...] [--elapsed SECONDS]

Prints one markdown table (one row per run: means over its training iterations) and exits non-zero when a run
did not finish its iterations, or when a vLLM run's sampler/trainer mismatch is above MAX_LOGPROB_DIFF. ``--note``
marks a step the check skipped or saw fail: a run without metrics is a row holding TEXT alone ("not run: vllm not
installed"), one with metrics (a failed or timed-out run) shows them with TEXT beside its name; such a row is no
problem here (tests/gpu/check.sh decides whether it fails the check).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Synced bf16 weights on both sides, different kernels: a few 1e-2 nats at most; a stale engine shows ~1e-1.
MAX_LOGPROB_DIFF = 0.05
ITERATIONS = 2
COLUMNS = [
    ("iteration s", "iteration_s", "{:.1f}"),  # the sum of the phases below (and the weight sync), see iterations()
    ("rollout s", "perf/rollout_s", "{:.1f}"),
    ("score s", "perf/score_s", "{:.1f}"),
    ("credit s", "perf/credit_s", "{:.3f}"),
    ("update s", "perf/update_s", "{:.1f}"),
    ("tokens/s", "perf/tokens_per_s", "{:.0f}"),
    ("env steps/s", "perf/env_steps_per_s", "{:.1f}"),
    ("logprob diff mean", "rollout/logprob_diff_mean", "{:.2e}"),
    ("logprob diff max", "rollout/logprob_diff_max", "{:.2e}"),
    ("sampler KL", "rollout/sampler_kl", "{:.2e}"),
]


def iterations(run_dir: Path) -> list[dict[str, float]]:
    """The training-iteration records of a run (the ones with an update), in order."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if "perf/update_s" in r]
    for r in records:
        r["iteration_s"] = sum(r.get(f"perf/{phase}_s", 0.0) for phase in ("rollout", "score", "credit", "update", "sync"))
    return records


def peak_memory_gib(mem_log: Path) -> float:
    samples = [float(x) for x in mem_log.read_text().split() if x.strip()] if mem_log.exists() else []
    return max(samples, default=0.0) / 1024


def row(runs: Path, name: str, note: str | None = None) -> tuple[list[str], list[str]]:
    """The table cells of one run and the problems found in it (none for a run with a note)."""
    if not (runs / name / "metrics.jsonl").exists() or (note is not None and not iterations(runs / name)):
        text = note if note is not None else f"no {name}/metrics.jsonl"
        return [name, text] + [""] * len(COLUMNS), [] if note is not None else [f"{name}: no metrics.jsonl"]
    records = iterations(runs / name)
    problems = [] if len(records) == ITERATIONS else [f"{name}: {len(records)} of {ITERATIONS} iterations"]
    mean = {key: sum(r[key] for r in records) / max(len(records), 1) for _, key, _ in COLUMNS}
    if "vllm" in name and mean["rollout/logprob_diff_mean"] > MAX_LOGPROB_DIFF:
        problems.append(f"{name}: sampler/trainer logprob diff {mean['rollout/logprob_diff_mean']:.3g} > "
                        f"{MAX_LOGPROB_DIFF} (are the weights synced?)")
    cells = [name if note is None else f"{name} ({note}; {len(records)} of {ITERATIONS} iterations)"]
    cells += [fmt.format(mean[key]) for _, key, fmt in COLUMNS]
    return cells + [f"{peak_memory_gib(runs / f'{name}.mem'):.1f}"], problems if note is None else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("names", nargs="+")
    parser.add_argument("--note", action="append", default=[], metavar="NAME=TEXT",
                        help="a step that did not run or failed: its row shows TEXT")
    parser.add_argument("--elapsed", type=int, default=None, help="wall seconds of the whole check")
    args = parser.parse_args(argv)
    header = ["run"] + [title for title, _, _ in COLUMNS] + ["peak GPU GiB"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    problems: list[str] = []
    notes = dict(entry.split("=", 1) for entry in args.note)
    for name in args.names:
        cells, found = row(args.runs, name, notes.get(name))
        lines.append("| " + " | ".join(cells) + " |")
        problems += found
    sys.stdout.write("\n".join(lines) + "\n")
    if args.elapsed is not None:
        sys.stdout.write(f"\nwhole check: {args.elapsed} s\n")
    for problem in problems:
        sys.stderr.write(f"gpu_check: FAILED: {problem}\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
