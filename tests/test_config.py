"""Start-up validation: bad values fail fast with the key and the allowed range in the message."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from processes import startup_bound_s

from progpo.config import ConfigError, validate_config

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def _cfg(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_default_config_is_valid():
    typed = validate_config(_cfg())
    assert typed.schedule.max_iterations >= 1
    assert typed.rollout.group_size >= 1
    assert typed.trainer.precision == "auto" and typed.ppo.kl_coef > 0 and typed.eval.every >= 1


def test_credit_history_follows_the_rollout_history():
    for credit in ("hgpo", "progpo"):
        assert _cfg(f"credit={credit}", "rollout.history=3").credit.history == 3
    # an explicit credit.history still wins (e.g. an ablation of the credit window alone)
    assert _cfg("rollout.history=3", "credit.history=1").credit.history == 1


def test_the_trainer_group_is_exactly_lightning_trainer_arguments():
    import inspect

    import lightning as L

    trainer_args = set(inspect.signature(L.Trainer.__init__).parameters)
    for choice in ("cpu", "gpu"):
        assert set(_cfg(f"trainer={choice}").trainer) <= trainer_args


@pytest.mark.parametrize("credit", ["grpo", "gigpo", "hgpo", "progpo"])
def test_every_credit_choice_is_valid(credit):
    validate_config(_cfg(f"credit={credit}"))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("credit.lambda_tr=-1", "credit.lambda_tr"),
        ("credit.history=-1", "credit.history"),
        ("credit.var_floor=0", "credit.var_floor"),
        ("credit.lambda_fb=1.5", "credit.lambda_fb"),
        ("optim.lr=0", "optim.lr"),
        ("schedule.max_iterations=0", "schedule.max_iterations"),
        ("ppo.clip_ratio=0", "ppo.clip_ratio"),
        ("eval.temperature=-1", "eval.temperature"),
        ("eval.episodes_per_task=0", "eval.episodes_per_task"),
        ("trainer.num_nodes=0", "trainer.num_nodes"),
        ("rollout.group_size=0", "rollout.group_size"),
        ("rollout.history=-2", "rollout.history"),
        ("env.max_steps=0", "env.max_steps"),
        ("rollout.engine.top_p=0", "rollout.engine.top_p"),
        ("model.attn_implementation=flash", "model.attn_implementation"),
    ],
)
def test_out_of_range_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_config(_cfg(override))


def test_several_held_out_episodes_per_task_need_sampling():
    validate_config(_cfg("eval.episodes_per_task=3", "eval.temperature=1.0"))
    with pytest.raises(ConfigError, match=r"eval\.episodes_per_task.*eval\.temperature > 0"):
        validate_config(_cfg("eval.episodes_per_task=3", "eval.temperature=0"))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("+trainer.lrr=1", "trainer.lrr"),
        ("+ppo.epoch=1", "ppo.epoch"),
        ("+credit.lambda_trr=1", "credit.lambda_trr"),
        ("+rollout.groupsize=3", "rollout.groupsize"),
        ("+env.nonsense=1", "env.nonsense"),
        ("+model.layers=3", "model.layers"),
        ("+typo_key=1", "typo_key"),
    ],
)
def test_unknown_keys_are_rejected(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_config(_cfg(override))


def test_an_experiment_that_names_its_mlflow_experiment_composes_with_logger_none():
    cfg = _cfg("experiment=webshop_laptop", "logger=none")
    assert cfg.logger.experiment_name == "webshop_laptop"  # the experiment's key merged into logger=none
    validate_config(cfg)  # accepted: logger=none knows the key logger.experiment_name
    with pytest.raises(ConfigError, match=r"logger\.tracking_uri"):
        validate_config(_cfg("experiment=webshop_laptop", "logger=none", "+logger.tracking_uri=sqlite:///x.db"))


def test_cli_rejects_negative_lambda_tr_fast(tmp_path):
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "progpo.train", "credit.lambda_tr=-1", f"hydra.run.dir={tmp_path}/run"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "credit.lambda_tr" in proc.stdout + proc.stderr
    assert elapsed < startup_bound_s(factor=1.0), f"validation took {elapsed:.1f}s, bound {startup_bound_s(1.0):.1f}s"


def _run_dir(*overrides: str) -> str:
    """The run folder ``python -m progpo.train <overrides>`` would use (Hydra's run dir, resolved as at start)."""
    from hydra.core.hydra_config import HydraConfig

    import progpo.runs  # noqa: F401  (registers the progpo.run_name resolver, as importing progpo.train does)

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    try:
        return cfg.hydra.run.dir
    finally:
        HydraConfig.instance().cfg = None  # later tests must not see a Hydra run (progpo.runs.resolve_run_dir)


def test_run_name_names_the_run_folder_so_an_ablation_does_not_replace_the_plain_run():
    assert _run_dir() == "outputs/runs/progpo-alfworld-tiny-seed0"
    assert _run_dir("credit=gigpo", "seed=2") == "outputs/runs/gigpo-alfworld-tiny-seed2"
    assert _run_dir("credit.min_value_group=0", "run_name=progpo-nosem-seed0") == "outputs/runs/progpo-nosem-seed0"
