"""The paper's protocol as a table (key, value, source), checked against the composed ``experiment=paper_*``
configs; and ``experiment=fast_dev`` composes and validates with every model."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from progpo.config import validate_config

CONF = Path(__file__).resolve().parents[2] / "conf"
PAPER = "paper Section 5.1"
VERL_AGENT = "verl-agent examples/gigpo_trainer/run_*.sh"

# key, value, source: the values both paper experiments share.
PROTOCOL = [
    ("rollout.tasks_per_batch", 16, PAPER),
    ("rollout.group_size", 8, PAPER),
    ("rollout.history", 2, PAPER),
    ("credit.history", 2, PAPER),
    ("optim.lr", 1e-6, PAPER),
    ("ppo.kl_coef", 0.01, PAPER),
    ("credit._target_", "progpo.credit.ProGPO", PAPER),
    ("credit.alpha", 1.0, PAPER),
    ("credit.min_value_group", 3, PAPER),
    ("credit.k_sem", 5, PAPER),
    ("credit.lambda_tr", 0.5, PAPER),
    ("credit.lambda_fb", 0.3, PAPER),
    ("credit.fusion", "inverse_variance", PAPER),
    ("credit.min_fusion_group", 2, PAPER),
    ("credit.var_floor", 1e-3, PAPER),
    ("rollout.engine._target_", "progpo.rollout.engines.vllm_engine.VLLMEngine", PAPER),
    ("rollout.engine.max_new_tokens", 512, VERL_AGENT),
    ("rollout.max_prompt_tokens", 2048, VERL_AGENT),
    ("ppo.minibatch_size", 256, VERL_AGENT),
    ("ppo.micro_batch_size", 32, VERL_AGENT),
    ("ppo.skip_zero_advantage", False, VERL_AGENT),
    ("env.n_eval", 128, VERL_AGENT),
    ("env.invalid_penalty", 0.1, VERL_AGENT),
    ("eval.every", 5, VERL_AGENT),
    ("eval.temperature", 0.4, VERL_AGENT),
    ("credit.gamma", 0.95, VERL_AGENT),
]
PER_ENV = {
    "paper_alfworld": [("env.max_steps", 50, PAPER), ("env.source", "official", PAPER),
                       ("env._target_", "envs.alfworld.make_suite", PAPER)],
    "paper_webshop": [("env.max_steps", 30, PAPER), ("env._target_", "envs.webshop.make_real_suite", PAPER)],
}


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return cfg


@pytest.mark.parametrize("experiment", sorted(PER_ENV))
def test_paper_experiment_matches_the_protocol_table(experiment):
    cfg = _compose(f"experiment={experiment}")
    validate_config(cfg)
    wrong = [(key, OmegaConf.select(cfg, key), value, source)
             for key, value, source in PROTOCOL + PER_ENV[experiment] if OmegaConf.select(cfg, key) != value]
    assert not wrong, f"composed value differs from the protocol (key, got, want, source): {wrong}"
    assert cfg.model.name == "qwen2.5-1.5b"
    # prompt + response must fit the model's context, or the 2048-token prompts would be cut
    assert cfg.rollout.max_prompt_tokens + cfg.rollout.engine.max_new_tokens <= cfg.model.max_context


def test_command_line_still_wins_over_the_paper_protocol():
    cfg = _compose("experiment=paper_alfworld", "rollout.engine.max_new_tokens=64", "ppo.minibatch_size=32")
    validate_config(cfg)
    assert (cfg.rollout.engine.max_new_tokens, cfg.ppo.minibatch_size) == (64, 32)


@pytest.mark.parametrize("model", sorted(p.stem for p in (CONF / "model").glob("*.yaml")))
def test_fast_dev_composes_with_every_model(model):
    cfg = _compose("experiment=fast_dev", f"model={model}")
    validate_config(cfg)
    assert cfg.schedule.max_iterations == 1 and cfg.warm_start.n_episodes == 12
    with open_dict(cfg):
        keys = set(cfg.model)
    assert ("warm_start" in keys) == (model == "tiny")  # only the model trained from scratch reads the warm start
