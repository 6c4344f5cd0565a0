"""Where WebShop success is lost: the configured model's choice on the item page, along the expert's own path.

    python scripts/webshop_option_clicks.py experiment=webshop_laptop [model/warm_start overrides...]
    python scripts/webshop_option_clicks.py --checkpoint outputs/runs/<run>/checkpoints/last.ckpt experiment=...

Every held-out goal is played by the expert (no noise) up to the purchase; at each item-page step the model is asked
(greedy, constrained to the admissible commands, with the prompt RL builds) and its command compared with the
expert's: an option click (the option the goal names) or "Buy Now" once the options are set. Prints both accuracies.
The model is built (or loaded from the cache) exactly as `python -m progpo.train` with the same overrides builds it;
``--checkpoint`` then loads an RL checkpoint's actor weights into it (the same overrides as that run), so the warm start
and what RL made of it are asked the same questions.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from progpo.rollout.projection import project_action
from progpo.runs import load_run_weights
from progpo.train import build
from progpo.warmstart import WarmStartConfig, collect_focus_demos

CONFIG_DIR = Path(__file__).resolve().parents[1] / "conf"


def expert_item_page_prompts(run):
    """(prompt ids, admissible, task text, expert command) at every item-page step of the expert's path on the
    held-out goals: the focus demos (clean expert, item pages only) of a suite whose tasks are the held-out ones."""
    held_out = replace(run.suite, train_tasks=run.suite.eval_tasks)
    cfg = WarmStartConfig(n_episodes=0, focus_episodes=len(held_out.train_tasks), focus_pages=("item",))
    demos, _ = collect_focus_demos(held_out, cfg)
    builder = run.collector.prompt_builder
    return [(builder.build(d.task_description, d.observation, d.admissible, d.past).ids, d.admissible,
             d.task_description, d.expert_action) for d in demos if d.expert_action != "click[< prev]"]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, help="an RL run's .ckpt: ask its actor instead of the warm start")
    args, overrides = parser.parse_known_args(argv)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    cfg.logger = OmegaConf.create({"_target_": "progpo.train.no_logger"})  # a probe, not a run: nothing tracked
    run = build(cfg)
    try:
        if args.checkpoint:
            load_run_weights(run, args.checkpoint)
        rows = expert_item_page_prompts(run)
        gen = run.engine.generate([r[0] for r in rows], greedy=True, admissible=[r[1] for r in rows],
                                  task_texts=[r[2] for r in rows])
    finally:
        run.collector.close()
        run.engine.close()
    tally = {"option": [0, 0], "buy now": [0, 0]}
    for (_, admissible, _, expert), text in zip(rows, gen.texts):
        kind = "buy now" if expert == "click[buy now]" else "option"
        tally[kind][0] += 1
        tally[kind][1] += project_action(text, admissible).action == expert
    for kind, (n, hit) in tally.items():
        print(f"{kind:8s} {hit}/{n} = {hit / max(n, 1):.0%} as the expert (greedy, expert's path, "  # noqa: T201
              f"{len(run.suite.eval_tasks)} held-out goals)")


if __name__ == "__main__":
    main(sys.argv[1:])
