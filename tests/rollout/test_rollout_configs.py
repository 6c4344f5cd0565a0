"""conf/model/*.yaml and conf/rollout/*.yaml: keys match their targets, and they build what they say."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf
from toy_env import TEST_SHAPE, TEST_WARM_START, fake_room_suite

from progpo.config import check_component
from progpo.rollout.engines.hf_engine import HFEngine
from progpo.types import Policy

CONF = Path(__file__).resolve().parents[2] / "conf"
SHARED_ROLLOUT_KEYS = {
    "tasks_per_batch",
    "group_size",
    "history",
    "num_workers",
    "step_timeout",
    "max_prompt_tokens",
}
# conf/rollout/*.yaml that choose an engine (batch.yaml holds the batch keys they share)
ENGINES = sorted(p for p in (CONF / "rollout").glob("*.yaml") if "engine" in OmegaConf.load(p))


def _rollout(name: str = "hf"):
    """The ``rollout`` group as ``rollout=<name>`` composes it (the engine file and the batch keys it includes)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        node = compose(config_name="config", overrides=[f"rollout={name}"]).rollout
    return OmegaConf.create(OmegaConf.to_container(node))


@pytest.mark.parametrize(
    "path", sorted((CONF / "model").glob("*.yaml")), ids=lambda p: f"{p.parent.name}-{p.stem}"
)
def test_model_configs_match_their_builders(path):
    node = OmegaConf.load(path)
    if path.read_text().startswith("# @package _global_"):  # a model file that also sizes the run
        node = node.model
    cfg = OmegaConf.create({"model": node, "seed": 0, "rollout": _rollout("hf"),
                            "warm_start": OmegaConf.load(CONF / "warm_start" / "default.yaml")})
    check_component(cfg.model, "model", runtime_kwargs=("suite", "device"))
    assert cfg.model.name == path.stem


@pytest.mark.parametrize("path", ENGINES, ids=lambda p: f"{p.parent.name}-{p.stem}")
def test_rollout_configs_have_the_shared_fields_and_a_valid_engine(path):
    cfg = OmegaConf.create({"rollout": _rollout(path.stem), "seed": 0})
    assert SHARED_ROLLOUT_KEYS <= set(cfg.rollout)
    assert cfg.rollout.history == 2 and cfg.rollout.max_prompt_tokens is None
    check_component(cfg.rollout.engine, "rollout.engine", runtime_kwargs=("policy",))


def test_tiny_yaml_follows_the_rollout_and_builds_a_policy_that_the_hf_yaml_engine_drives():
    cfg = OmegaConf.create(
        {
            "model": OmegaConf.load(CONF / "model" / "tiny.yaml"),
            "rollout": _rollout("hf"),
        }
    )
    cfg.rollout.history = 1
    cfg.rollout.engine.max_new_tokens = 16
    assert cfg.model.history == 1 and cfg.model.max_new_tokens == 16  # interpolated from the rollout
    for key, value in TEST_SHAPE.items():
        cfg.model[key] = value
    cfg.model.warm_start = {**TEST_WARM_START, "n_episodes": 0}
    policy = instantiate(cfg.model, suite=fake_room_suite(), device="cpu")
    assert isinstance(policy, Policy) and policy.name == "tiny"
    engine = instantiate(cfg.rollout.engine, policy=policy)
    assert isinstance(engine, HFEngine) and engine.max_new_tokens == 16
    assert len(engine.generate([[1, 2, 3]]).response_ids[0]) <= 16
