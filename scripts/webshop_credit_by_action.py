"""What the credit estimator rewards on WebShop: mean advantage by kind of action over a few rollout batches.

    python scripts/webshop_credit_by_action.py experiment=webshop_laptop [--batches 4] [overrides...]
    python scripts/webshop_credit_by_action.py --checkpoint outputs/runs/<run>/checkpoints/last.ckpt experiment=...

Builds the configured run (warm start cached as usual; ``--checkpoint``: then an RL checkpoint's weights, with the
same overrides as that run), collects ``--batches`` training batches with that policy (nothing is trained), scores
them and runs the configured credit estimator on each. Every step is sorted by its command: ``search``, ``product``
(a result link), ``option right`` / ``option wrong`` (an option the goal does or does not name), ``buy now`` (split
by whether every option the goal names had been clicked before it) and the navigation buttons. Prints per kind:
steps, steps per episode (the policy's habits: compare a checkpoint with the warm start, on training draws and,
with ``--held-out``, on the held-out goals), mean advantage, shares positive and negative, share of steps in won
episodes, and the mean of each advantage part (ProGPO: ``a_hier``, ``a_trans``).
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
from omegaconf import OmegaConf

from envs.webshop.shop import BACK_TO_SEARCH, END_BUTTON, NEXT_PAGE, PREV_PAGE, SUB_PAGES
from progpo.algo.credit import batch_credit
from progpo.algo.iteration import step_batch
from progpo.algo.scoring import score_turns
from progpo.runs import load_run_weights
from progpo.train import build

CONF = str(Path(__file__).resolve().parents[1] / "conf")
NAVIGATION = tuple(b.lower() for b in (PREV_PAGE, NEXT_PAGE, BACK_TO_SEARCH, *SUB_PAGES))


def command_target(action: str) -> str:
    """What a WebShop command names, lower case: ``click[Grey]`` -> ``grey``."""
    command = action.strip().lower()
    return command[command.find("[") + 1 : -1]


def action_kind(action: str, goal_options: set[str]) -> str:
    """The kind of a WebShop command, relative to the goal's options."""
    if action.strip().lower().startswith("search["):
        return "search"
    target = command_target(action)
    if target == END_BUTTON.lower():
        return "buy now"
    if target in NAVIGATION:
        return target
    if target.startswith("b0") and len(target) == 10:  # an ASIN: a product link on a results page
        return "product"
    return "option right" if target in goal_options else "option wrong"


def step_kinds(turns, goal_options: dict[int, set[str]]) -> list[str]:
    """The kind of every turn (in the batch's order); "buy now" is split by whether every option the goal names
    (``goal_options[turn.group]``, lower case) was clicked earlier in the same trajectory."""
    kinds = [""] * len(turns)
    clicked: dict[int, set[str]] = defaultdict(set)  # the goal's options clicked so far, per trajectory
    for i in sorted(range(len(turns)), key=lambda j: (turns[j].traj, turns[j].t)):
        turn = turns[i]
        options = goal_options[turn.group]
        kind = action_kind(turn.action, options)
        if kind == "option right":
            clicked[turn.traj].add(command_target(turn.action))
        elif kind == "buy now":
            kind += ", options set" if options <= clicked[turn.traj] else ", options not set"
        kinds[i] = kind
    return kinds


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--checkpoint", type=Path, help="an RL run's .ckpt: collect with its actor, not the warm start")
    parser.add_argument("--held-out", action="store_true",
                        help="play the held-out goals (in order, one batch's worth each) instead of training draws")
    args, overrides = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="progpo-credit-") as tmp:
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"run_dir={tmp}/run", *overrides])
        cfg.logger = OmegaConf.create({"_target_": "progpo.train.no_logger"})  # a probe, not a run: nothing tracked
        run = build(cfg)
        rl = run.module.rl
        n_episodes = 0
        rows: dict[str, list[tuple[float, bool, dict[str, float]]]] = defaultdict(list)
        try:
            if args.checkpoint:
                load_run_weights(run, args.checkpoint)
            size = run.datamodule.tasks_per_batch
            if args.held_out and args.batches * size > len(run.suite.eval_tasks):
                raise SystemExit(f"--batches {args.batches} x {size} tasks needs more than the "
                                 f"{len(run.suite.eval_tasks)} held-out goals: pass --batches "
                                 f"{len(run.suite.eval_tasks) // size} or fewer with --held-out")
            for index in range(args.batches):
                torch.manual_seed(index)
                if args.held_out:
                    tasks = run.suite.eval_tasks[index * size : (index + 1) * size]
                else:
                    tasks = run.datamodule.train_batch().tasks
                batch = rl.collector.collect(tasks, rl.group_size)
                scored = score_turns(rl.actor, None, batch.turns, rl.pad_token_id, rl.ppo.micro_batch_size)
                credit = batch_credit(rl.credit, step_batch(batch.turns, scored.embeddings))
                goal_options = {e.group: {str(v).lower() for v in e.task.payload["goal"]["goal_options"].values()}
                                for e in batch.episodes}
                won = {e.traj: e.won for e in batch.episodes}
                n_episodes += len(batch.episodes)
                for i, (turn, kind) in enumerate(zip(batch.turns, step_kinds(batch.turns, goal_options))):
                    parts = {name: float(part[i]) for name, part in credit.parts.items()}
                    rows[kind].append((float(credit.advantage[i]), won[turn.traj], parts))
                print(f"batch {index}: {sum(won.values())} of {len(won)} episodes won", flush=True)  # noqa: T201
        finally:
            run.collector.close()
            run.engine.close()
    print(f"{'kind':26s} {'steps':>6s} {'/ episode':>9s} {'mean adv':>9s} {'> 0':>6s} {'< 0':>6s} {'won':>6s}  "  # noqa: T201
          "parts (means)")
    for kind, steps in sorted(rows.items(), key=lambda item: -len(item[1])):
        adv = [a for a, _, _ in steps]
        parts = " ".join(f"{n}={statistics.fmean(p[n] for _, _, p in steps):+.4f}" for n in steps[0][2])
        print(f"{kind:26s} {len(steps):6d} {len(steps) / n_episodes:9.3f} {statistics.fmean(adv):+9.4f} "  # noqa: T201
              f"{sum(a > 0 for a in adv) / len(adv):6.2f} "
              f"{sum(a < 0 for a in adv) / len(adv):6.2f} {sum(w for _, w, _ in steps) / len(steps):6.2f}  {parts}")


if __name__ == "__main__":
    main(sys.argv[1:])
