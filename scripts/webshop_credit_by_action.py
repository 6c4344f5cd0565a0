"""What the credit estimator rewards on WebShop: mean advantage by kind of action over a few rollout batches.

    python scripts/webshop_credit_by_action.py experiment=webshop_laptop [--batches 4] [overrides...]

Builds the configured run (warm start cached as usual), collects ``--batches`` training batches with the warm-started
policy (nothing is trained), scores them and runs the configured credit estimator on each. Every step is sorted by
its command: ``search``, ``product`` (a result link), ``option right`` / ``option wrong`` (an option the goal does
or does not name), ``buy now`` and the navigation buttons. Prints per kind: steps, mean advantage, shares positive
and negative, share of steps in won episodes, and the mean of each advantage part (ProGPO: ``a_hier``, ``a_trans``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from envs.webshop.shop import BACK_TO_SEARCH, END_BUTTON, NEXT_PAGE, PREV_PAGE, SUB_PAGES
from progpo.algo.credit import batch_credit
from progpo.algo.iteration import step_batch
from progpo.algo.scoring import score_turns
from progpo.train import build

CONF = str(Path(__file__).resolve().parents[1] / "conf")
NAVIGATION = tuple(b.lower() for b in (PREV_PAGE, NEXT_PAGE, BACK_TO_SEARCH, *SUB_PAGES))


def action_kind(action: str, goal_options: set[str]) -> str:
    """The kind of a WebShop command, relative to the goal's options."""
    command = action.strip().lower()
    if command.startswith("search["):
        return "search"
    target = command[command.find("[") + 1 : -1]
    if target == END_BUTTON.lower():
        return "buy now"
    if target in NAVIGATION:
        return target
    if target.startswith("b0") and len(target) == 10:  # an ASIN: a product link on a results page
        return "product"
    return "option right" if target in goal_options else "option wrong"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4)
    args, overrides = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="progpo-credit-") as tmp:
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose(config_name="config", overrides=[
                f"run_dir={tmp}/run", f"logger.tracking_uri=sqlite:///{tmp}/mlflow.db", *overrides])
        run = build(cfg)
        rl = run.module.rl
        rows: dict[str, list[tuple[float, bool, dict[str, float]]]] = defaultdict(list)
        try:
            for index in range(args.batches):
                torch.manual_seed(index)
                batch = rl.collector.collect(run.datamodule.train_batch().tasks, rl.group_size)
                scored = score_turns(rl.actor, None, batch.turns, rl.pad_token_id, rl.ppo.micro_batch_size)
                credit = batch_credit(rl.credit, step_batch(batch.turns, scored.embeddings))
                goal_of = {e.group: e.task.payload["goal"] for e in batch.episodes}
                won = {e.traj: e.won for e in batch.episodes}
                for i, turn in enumerate(batch.turns):
                    options = {str(v).lower() for v in goal_of[turn.group]["goal_options"].values()}
                    parts = {name: float(part[i]) for name, part in credit.parts.items()}
                    rows[action_kind(turn.action, options)].append((float(credit.advantage[i]), won[turn.traj], parts))
                print(f"batch {index}: {sum(won.values())} of {len(won)} episodes won", flush=True)  # noqa: T201
        finally:
            run.collector.close()
            run.engine.close()
    print(f"{'kind':15s} {'steps':>6s} {'mean adv':>9s} {'> 0':>6s} {'< 0':>6s} {'won':>6s}  parts (means)")  # noqa: T201
    for kind, steps in sorted(rows.items(), key=lambda item: -len(item[1])):
        adv = [a for a, _, _ in steps]
        parts = " ".join(f"{n}={statistics.fmean(p[n] for _, _, p in steps):+.4f}" for n in steps[0][2])
        print(f"{kind:15s} {len(steps):6d} {statistics.fmean(adv):+9.4f} {sum(a > 0 for a in adv) / len(adv):6.2f} "  # noqa: T201
              f"{sum(a < 0 for a in adv) / len(adv):6.2f} {sum(w for _, w, _ in steps) / len(steps):6.2f}  {parts}")


if __name__ == "__main__":
    main(sys.argv[1:])
