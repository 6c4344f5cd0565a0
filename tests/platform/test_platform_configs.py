"""The experiment and ablation configs compose with the real conf/ tree and pass the trainer's validation."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from progpo.config import validate_config
from progpo.report.records import transition_variant
from progpo.sweep import SweepSpec, trial_config

CONF = str(Path(__file__).resolve().parents[2] / "conf")


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    hydra_node = cfg.hydra
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, hydra_node


@pytest.mark.parametrize(
    ("variant", "min_value_group", "fusion"),
    [("plain", 0, "single"), ("semantic", 3, "single"), ("fusion", 0, "inverse_variance"),
     ("full", 3, "inverse_variance")],
)
def test_ablation_variants_are_parameter_settings(variant, min_value_group, fusion):
    cfg, hydra_node = _compose("experiment=ablation_transition", f"ablation={variant}")
    validate_config(cfg)
    assert cfg.credit._target_ == "progpo.credit.ProGPO"
    assert (cfg.credit.min_value_group, cfg.credit.fusion) == (min_value_group, fusion)
    assert hydra_node.runtime.choices.ablation == variant  # becomes the run's `ablation` tag
    assert cfg.logger.experiment_name == "ablation_transition"
    assert dict(hydra_node.sweeper.params) == {"ablation": "plain,semantic,fusion,full", "seed": "0,1,2"}
    # the report reads the variant back from the logged credit params (how an untagged ProGPO run counts)
    logged = {f"credit.{k}": str(v) for k, v in cfg.credit.items()}
    assert transition_variant(logged) == variant


def test_a_compare_methods_progpo_run_is_the_full_variant():
    cfg, _ = _compose("experiment=compare_methods", "credit=progpo")
    assert transition_variant({f"credit.{k}": str(v) for k, v in cfg.credit.items()}) == "full"


def test_compare_methods_sweeps_the_four_estimators():
    cfg, hydra_node = _compose("experiment=compare_methods")
    validate_config(cfg)
    assert dict(hydra_node.sweeper.params) == {"credit": "grpo,gigpo,hgpo,progpo", "seed": "0,1,2"}
    assert cfg.logger.experiment_name == "compare_methods"
    smoke, _ = _compose("experiment=[compare_methods,fast_dev]", "credit=hgpo")
    validate_config(smoke)
    assert smoke.schedule.max_iterations == 1 and smoke.logger.experiment_name == "compare_methods"


@pytest.mark.parametrize("sweep", ["compare_methods", "ablation_transition"])
def test_the_laptop_benchmark_setting_composes_with_the_sweep_experiments(sweep):
    """``experiment=[<sweep>,laptop_alfworld]``: the sweep's parameters, the benchmark's env, batch, schedule and
    MLflow experiment (so its runs never mix with the default setting's in a report), one shared warm start."""
    plain, _ = _compose(f"experiment={sweep}")
    cfg, hydra_node = _compose(f"experiment=[{sweep},laptop_alfworld]", "seed=2")
    validate_config(cfg)
    assert dict(hydra_node.sweeper.params) == dict(_compose(f"experiment={sweep}")[1].sweeper.params)
    assert cfg.credit == plain.credit  # the estimator (and ablation variant) is the sweep's
    assert cfg.env.max_steps == 40 and dict(cfg.env.scene) == {
        "min_receptacles": 5, "max_receptacles": 8, "min_distractors": 2, "max_distractors": 6, "hide_prob": 0.7,
        "closed_parent_prob": 0.4}
    assert (cfg.rollout.tasks_per_batch, cfg.rollout.group_size, cfg.schedule.max_iterations, cfg.eval.every) == (
        8, 8, 6, 3)
    assert cfg.logger.experiment_name == "laptop_alfworld"
    assert hydra_node.sweep.dir.startswith("outputs/multirun/laptop_alfworld/")
    assert cfg.seed == 2 and cfg.model.seed == 0 and cfg.warm_start.seed == 0


@pytest.mark.parametrize(("name", "env", "max_steps"), [("paper_alfworld", "alfworld", 50),
                                                         ("paper_webshop", "webshop_real", 30)])
def test_paper_settings(name, env, max_steps):
    cfg, hydra_node = _compose(f"experiment={name}")
    validate_config(cfg)
    choices = hydra_node.runtime.choices
    assert (choices.env, choices.model, choices.credit, choices.rollout, choices.trainer) == (
        env, "qwen2.5-1.5b", "progpo", "vllm", "gpu")
    assert (cfg.rollout.tasks_per_batch, cfg.rollout.group_size, cfg.rollout.history) == (16, 8, 2)
    assert (cfg.optim.lr, cfg.ppo.kl_coef, cfg.schedule.max_iterations) == (1e-6, 0.01, 160)
    assert cfg.env.max_steps == max_steps and cfg.credit.history == 2
    # the paper updates on every step and validates at verl-agent's T=0.4 (the CPU default differs in both)
    assert cfg.ppo.skip_zero_advantage is False and cfg.eval.temperature == 0.4


def test_trial_config_applies_sampled_values_and_links_the_study(tmp_path):
    spec = SweepSpec(study_name="s", overrides=("experiment=fast_dev",), output_dir=str(tmp_path))
    cfg = trial_config(spec, {"credit.lambda_tr": 0.25, "rollout.history": 1}, number=7)
    validate_config(cfg)
    # K_h moves the prompt window and the estimator's prefix depth together
    assert (cfg.credit.lambda_tr, cfg.rollout.history, cfg.credit.history, cfg.model.history) == (0.25, 1, 1, 1)
    assert cfg.run_dir == str(tmp_path / "s" / "trial_0007")
    assert cfg.logger.experiment_name == "s" and cfg.logger.group == "s"
    assert cfg.logger.tags == {"optuna.study_name": "s", "optuna.trial_number": "7"}
    from progpo.sweep import SweepSpecError

    with pytest.raises(SweepSpecError, match="'credit.lambda_trr' is not in the trainer config"):
        trial_config(spec, {"credit.lambda_trr": 0.1}, number=8)


def test_trial_is_named_after_method_env_model_seed_and_number(tmp_path):
    spec = SweepSpec(study_name="s", overrides=("credit=grpo", "env=webshop", "seed=3"), output_dir=str(tmp_path))
    cfg = trial_config(spec, {}, number=12)
    assert cfg.run_name == "grpo-webshop-tiny-seed3-trial12" and "run_name" not in cfg.logger  # one name


def test_command_line_overrides_win_over_the_sweep_file(tmp_path):
    """`python -m progpo.sweep FILE -- experiment=fast_dev`: the experiment beats the file's trainer settings."""
    spec = SweepSpec(study_name="s", output_dir=str(tmp_path),
                     overrides=("credit=progpo", "schedule.max_iterations=30", "eval.every=5",
                                "optim.lr=3e-6", "credit.k_sem=7"))
    file_only = trial_config(spec, {}, number=0)
    assert (file_only.schedule.max_iterations, file_only.eval.every) == (30, 5)

    cfg = trial_config(spec, {}, number=0, extra=["experiment=fast_dev", "credit.k_sem=2"])
    validate_config(cfg)
    assert (cfg.schedule.max_iterations, cfg.eval.every) == (1, 1)  # fast_dev's values
    assert (cfg.env.n_train, cfg.rollout.tasks_per_batch) == (12, 2)  # the rest of fast_dev
    assert cfg.credit.k_sem == 2  # a key=value after `--` beats the same key in the file
    assert cfg.optim.lr == 3e-6  # keys the command line leaves alone keep the file's value
    assert cfg.credit._target_ == "progpo.credit.ProGPO"

    sampled = trial_config(spec, {"credit.k_sem": 4}, number=1, extra=["credit.k_sem=2"])
    assert sampled.credit.k_sem == 4  # the sampled value is applied last


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent package (hydra_plugins) is missing too
        return False


@pytest.mark.skipif(not _has_module("hydra_plugins.hydra_joblib_launcher"),
                    reason="hydra-joblib-launcher not installed (extra `parallel`)")
def test_joblib_launcher_composes_with_an_experiment():
    _, hydra_node = _compose("experiment=compare_methods", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert "JoblibLauncher" in hydra_node.launcher._target_ and hydra_node.launcher.n_jobs == 2


@pytest.mark.parametrize(
    ("experiment", "subdir_choice"),
    [("compare_methods", "runtime.choices.credit"), ("ablation_transition", "runtime.choices.ablation")],
)
def test_experiment_multirun_writes_under_its_own_folder(experiment, subdir_choice):
    """The experiment file's `hydra.sweep` wins over conf/config.yaml's (config.yaml lists `_self_` first)."""
    _, hydra_node = _compose(f"experiment={experiment}")
    sweep_dir = Path(hydra_node.sweep.dir)
    assert sweep_dir.parent == Path("outputs/multirun") / experiment, sweep_dir
    assert subdir_choice in OmegaConf.to_container(hydra_node.sweep)["subdir"]


def test_plain_multirun_keeps_the_default_folder():
    _, hydra_node = _compose()
    assert Path(hydra_node.sweep.dir).parent == Path("outputs/multirun")
