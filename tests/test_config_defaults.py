"""One source for every default, one name for every run.

The YAML decides the defaults: a typed group built in Python (``PPOConfig()``, ...) must be the group that
``python -m progpo.train`` composes without overrides, so each field's dataclass default is compared with the composed
value (change one side alone and this fails). And the run's folder and its MLflow run carry one name
(``progpo.runs.run_name``), whatever the env file or ``run_name``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict

from progpo.config.groups import TYPED_GROUPS, RunConfig, WarmStartConfig
from progpo.runs import run_name

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = {**TYPED_GROUPS, "warm_start": WarmStartConfig}
# rollout.engine is a `_target_` component (the rollout file picks the engine class, whose signature checks it): the
# dataclass holds no default for it.
NOT_TYPED_HERE = {("rollout", "engine")}


def _compose(*overrides: str, config_name: str = "config"):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)


def _default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


@pytest.fixture(scope="module")
def default_cfg():
    cfg = _compose()
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_dataclass_default_is_the_composed_default_yaml(default_cfg, group):
    schema = GROUPS[group]
    yaml = OmegaConf.to_container(default_cfg[group], resolve=True)
    names = [f.name for f in dataclasses.fields(schema)]
    assert set(yaml) == set(names), f"{group}: the YAML's keys and the dataclass's fields differ"
    wrong = [(f"{group}.{f.name}", _default(f), yaml[f.name]) for f in dataclasses.fields(schema)
             if (group, f.name) not in NOT_TYPED_HERE and _plain(_default(f)) != _plain(yaml[f.name])]
    assert not wrong, f"dataclass default != composed YAML (key, dataclass, yaml): {wrong}"


def test_run_config_defaults_are_the_composed_default_yaml(default_cfg):
    for field in dataclasses.fields(RunConfig):
        if field.name not in GROUPS:
            assert _default(field) == default_cfg[field.name], field.name


def _names(*overrides: str) -> tuple[str, str]:
    """(run folder, MLflow run name) of ``python -m progpo.train <overrides>``: Hydra's run dir, resolved as at start,
    and the name the trainer gives ``cfg.run_name`` (``progpo.train._prepare``), which the MLflow logger takes."""
    cfg = _compose(*overrides)
    HydraConfig.instance().set_config(cfg)
    try:
        folder = Path(cfg.hydra.run.dir)
    finally:
        HydraConfig.instance().cfg = None  # later tests must not see a Hydra run
    assert folder.parent == Path("outputs/runs")
    with open_dict(cfg):
        del cfg["hydra"]
        cfg.run_name = run_name(cfg)
    assert "run_name" not in cfg.logger  # the logger has no name of its own
    return folder.name, cfg.run_name


@pytest.mark.parametrize(("overrides", "name"), [
    ((), "progpo-alfworld-tiny-seed0"),
    (("credit=gigpo", "seed=2"), "gigpo-alfworld-tiny-seed2"),
    (("env=webshop",), "progpo-webshop-tiny-seed0"),
    (("env=webshop_real",), "progpo-webshop_real-tiny-seed0"),
    (("experiment=paper_webshop",), "progpo-webshop_real-qwen2.5-1.5b-seed0"),
    (("model=smollm2-135m",), "progpo-alfworld-smollm2-135m-seed0"),
    (("env=webshop_real", "run_name=mine"), "mine"),
])
def test_the_run_folder_and_the_mlflow_run_have_one_name(overrides, name):
    assert _names(*overrides) == (name, name)


def test_the_mlflow_logger_names_its_run_as_the_folder(tmp_path):
    import mlflow

    folder, _ = _names("env=webshop_real")
    cfg = _compose("env=webshop_real", f"logger.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
                   "logger.log_config=false", "logger.retries=0")
    with open_dict(cfg):
        del cfg["hydra"]
        cfg.run_name = run_name(cfg)
    logger = instantiate(cfg.logger, cfg=cfg)
    logger.end_run("FINISHED")
    assert mlflow.MlflowClient(cfg.logger.tracking_uri).get_run(logger.run_id).info.run_name == folder


@pytest.mark.parametrize(("overrides", "name"), [
    ((), "fidelity-alfworld-tiny-seed0"),
    (("env=webshop_real",), "fidelity-webshop_real-tiny-seed0"),
    (("ckpt_path=outputs/runs/progpo-alfworld-tiny-seed0/checkpoints/last.ckpt",),
     "fidelity-alfworld-tiny-seed0-progpo-alfworld-tiny-seed0-last"),
    (("run_name=mine",), "mine"),
])
def test_fidelity_runs_are_named_by_the_same_function(overrides, name):
    import progpo.fidelity.measure  # noqa: F401  (python -m progpo.fidelity imports it before Hydra starts)

    cfg = _compose(*overrides, config_name="fidelity")
    HydraConfig.instance().set_config(cfg)
    try:
        folder = Path(cfg.hydra.run.dir)
    finally:
        HydraConfig.instance().cfg = None
    assert folder == Path("outputs/fidelity") / name
    with open_dict(cfg):
        del cfg["hydra"]
    assert run_name(cfg, "fidelity") == name
