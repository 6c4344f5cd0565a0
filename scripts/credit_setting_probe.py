"""How much a setting exercises step-level credit: one iteration's rollouts, the four estimators' diagnostics.

    python scripts/credit_setting_probe.py [hydra overrides...]
    python scripts/credit_setting_probe.py env.max_steps=40 env.scene.hide_prob=0.7 ...

Builds the configured run (warm start included, cached as usual), collects one iteration's batch with the
warm-started policy, scores it (state embeddings), and runs GRPO, GiGPO, HGPO and ProGPO on the same batch. It
prints what the choice of a benchmark setting (issue 17) rests on: training success and episode length, how
often states recur across the rollouts of a task (what exact-prefix peers and transition credit feed on), and
per estimator the ``credit/*`` shares and the share of steps with a non-zero advantage. Nothing is trained.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from progpo.algo.iteration import step_batch
from progpo.algo.scoring import score_turns
from progpo.credit import DIAGNOSTIC_STATS
from progpo.train import build

CONF = str(Path(__file__).resolve().parents[1] / "conf")
METHODS = ("grpo", "gigpo", "hgpo", "progpo")


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def recurring_share(turns) -> float:
    """Share of steps whose state another trajectory of the same task also visited."""
    seen: dict[tuple[int, int], set[int]] = {}
    for t in turns:
        seen.setdefault((t.group, t.obs_id), set()).add(t.traj)
    return statistics.fmean(len(seen[(t.group, t.obs_id)]) > 1 for t in turns)


def main(overrides: list[str]) -> None:
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory(prefix="progpo-probe-") as tmp:
        base = ["logger=none", f"run_dir={tmp}/run", *overrides]
        run = build(_compose(base))
        try:
            rl = run.module.rl
            torch.manual_seed(0)
            started = time.perf_counter()
            batch = rl.collector.collect(run.datamodule.train_batch().tasks, rl.group_size)
            collect_s = time.perf_counter() - started
            scored = score_turns(rl.actor, None, batch.turns, rl.pad_token_id, rl.ppo.micro_batch_size)
            steps = step_batch(batch.turns, scored.embeddings)
            lengths = Counter(t.traj for t in batch.turns)
            wins = {t.traj for t in batch.turns if t.reward > 0}
            lines = [f"# credit setting probe: {' '.join(overrides) or '(default)'}",
                     f"{len(batch.turns)} steps in {len(lengths)} episodes, collected in {collect_s:.0f} s; "
                     f"training success {len(wins) / len(lengths):.1%}; steps per episode mean "
                     f"{statistics.fmean(lengths.values()):.1f} (max {max(lengths.values())}); steps whose state "
                     f"another rollout of the task visited: {recurring_share(batch.turns):.1%}",
                     "", "| method | " + " | ".join(DIAGNOSTIC_STATS) + " | non-zero advantage |",
                     "|---|" + "---:|" * (len(DIAGNOSTIC_STATS) + 1)]
            for method in METHODS:
                estimator = instantiate(_compose([*base, f"credit={method}"]).credit)
                result = estimator(steps)
                shares = [f"{result.stats[k]:.1%}" if k in result.stats else "-" for k in DIAGNOSTIC_STATS]
                nonzero = float((result.advantage != 0).double().mean())
                lines.append(f"| {method} | " + " | ".join(shares) + f" | {nonzero:.1%} |")
        finally:
            run.collector.close()
            run.engine.close()
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
