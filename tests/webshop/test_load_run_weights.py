"""``progpo.runs.load_run_weights`` (the probes' ``--checkpoint``): an RL checkpoint's actor is what generates."""

from __future__ import annotations

from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from moved_weights import moved_state_dict
from omegaconf import OmegaConf

from progpo.runs import load_run_weights
from progpo.train import build

ROOT = Path(__file__).resolve().parents[2]


def test_load_run_weights_puts_the_checkpoints_actor_weights_into_the_policy_that_generates(tmp_path):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=fast_dev", "env=webshop", "env.n_products=200",
                                                       f"run_dir={tmp_path / 'run'}", "torch_threads=1"])
    cfg.logger = OmegaConf.create({"_target_": "progpo.train.no_logger"})
    run = build(cfg)
    try:
        actor = run.module.actor
        moved = moved_state_dict(actor, scale=1.0, prefix="actor.")
        assert set(moved) == set(run.module.state_dict())  # what Lightning saves of the module
        ckpt = tmp_path / "rl.ckpt"
        torch.save({"state_dict": moved}, ckpt)
        prompt = run.policy.tokenizer("<action>", add_special_tokens=False)["input_ids"]
        before = run.engine.generate([prompt], greedy=True).response_ids
        load_run_weights(run, ckpt)
        for name, value in actor.state_dict().items():
            torch.testing.assert_close(value, moved[f"actor.{name}"])
        assert run.engine.generate([prompt], greedy=True).response_ids != before  # the engine samples with them
    finally:
        run.collector.close()
        run.engine.close()
