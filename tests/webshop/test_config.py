"""conf/env/webshop.yaml instantiates the offline shop's EnvSuite (as the trainer does with ``cfg.env``)."""

from __future__ import annotations

import inspect
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import OmegaConf

from envs.base import EnvSuite
from envs.webshop import make_suite

CONF = Path(__file__).resolve().parents[2] / "conf" / "env" / "webshop.yaml"


def _env_file():
    """The env group file as Hydra places it under ``env``: its ``defaults`` list (the warm start it picks) is
    Hydra's, not the suite's."""
    cfg = OmegaConf.load(CONF)
    assert list(cfg.pop("defaults")) == [{"override /warm_start@_global_.warm_start": "webshop"}, "_self_"]
    return cfg


def test_config_documents_every_argument_with_defaults():
    cfg = _env_file()
    params = inspect.signature(make_suite).parameters
    assert set(cfg) - {"_target_"} == set(params)
    for name, param in params.items():
        assert cfg[name] == param.default, name
    assert (cfg.max_steps, cfg.invalid_penalty, cfg.results_per_page, cfg.n_eval) == (30, 0.1, 10, 100)


def test_instantiate_with_fast_dev_overrides_and_run_one_episode():
    cfg = OmegaConf.merge(_env_file(), {"n_train": 12, "n_eval": 6, "max_steps": 6})
    suite = instantiate(cfg)
    assert isinstance(suite, EnvSuite)
    assert (len(suite.train_tasks), len(suite.eval_tasks), suite.max_steps) == (12, 6, 6)
    env = suite.env_factory()
    env.reset(suite.train_tasks[0])
    done, steps = False, 0
    while not done:
        _, _, done, info = env.step(env.expert_action())
        steps += 1
    assert steps <= 6 and info.won


def test_env_webshop_picks_its_own_warm_start_and_the_command_line_still_wins():
    from hydra import compose, initialize_config_dir

    conf = str(CONF.parents[1])
    with initialize_config_dir(conf, version_base=None):
        shop = compose("config", overrides=["env=webshop"])
        alfworld = compose("config", overrides=["env=alfworld"])
        mine = compose("config", overrides=["env=webshop", "warm_start.epochs=5"])
        laptop = compose("config", overrides=["experiment=webshop_laptop"])
    assert (shop.warm_start.n_episodes, shop.warm_start.epochs) == (150, 2)
    assert shop.warm_start.lr == alfworld.warm_start.lr  # the rest is the default's
    assert (alfworld.warm_start.n_episodes, alfworld.warm_start.epochs) == (400, 3)
    assert mine.warm_start.epochs == 5
    assert shop.env.reward == "success"  # the paper's reward unless asked
    assert laptop.env.reward == "success" and laptop.env.max_steps == 30  # the paper's reward
    assert (laptop.rollout.tasks_per_batch, laptop.rollout.group_size) == (16, 8)  # the ALFWorld default's batch
    assert laptop.eval.episodes_per_task == 3 and shop.eval.episodes_per_task == 1
    assert (laptop.warm_start.n_episodes, laptop.warm_start.epochs, laptop.warm_start.seed) == (400, 3, 0)
    assert laptop.warm_start.focus_episodes == 6000 and list(laptop.warm_start.focus_pages) == ["item"]
    assert (laptop.warm_start.focus_epochs, laptop.warm_start.focus_replay_episodes) == (1, 300)
    assert laptop.env.n_train == 8000 and laptop.model.bracket_words and laptop.optim.lr == 5e-5
    assert shop.warm_start.focus_episodes == 0 and alfworld.warm_start.focus_episodes == 0
    # the experiment's focus episodes (training tasks 400..6399) are training goals, none of them held out
    assert laptop.warm_start.n_episodes + laptop.warm_start.focus_episodes <= laptop.env.n_train
