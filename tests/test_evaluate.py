"""`python -m progpo.evaluate`: one held-out evaluation of the model as built, no training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from lightning.pytorch import Callback
from moved_weights import moved_state_dict

from progpo.config import ConfigError
from progpo.evaluate import evaluate
from progpo.train import build

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def test_evaluate_plays_the_held_out_set_once_and_trains_nothing(tmp_path):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=fast_dev", "logger=none", "env.n_eval=3",
                                                       f"run_dir={tmp_path / 'run'}"])
    metrics = evaluate(cfg)
    assert 0.0 <= metrics["val/success"] <= 1.0 and metrics["val/invalid_rate"] == 0.0  # tiny: constrained
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records and not any("loss/policy" in r for r in records)  # evaluated, never updated
    assert not (tmp_path / "run" / "checkpoints").exists()


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=["experiment=fast_dev", "logger=none", "env.n_eval=3",
                                                        *overrides])


class _WeightsAtValidation(Callback):
    """The actor's weights as the held-out evaluation starts."""

    def on_validation_start(self, trainer, pl_module) -> None:
        self.weights = {k: v.detach().clone() for k, v in pl_module.actor.state_dict().items()}


def test_evaluate_with_ckpt_path_plays_the_checkpoints_weights_in_a_run_of_its_own(tmp_path):
    # A checkpoint as Lightning saves the module, with every weight moved away from the warm start's.
    run = build(_compose(f"run_dir={tmp_path / 'train'}"))
    try:
        moved = moved_state_dict(run.module.actor, scale=0.01, prefix="actor.")
        assert set(moved) == set(run.module.state_dict())  # what Lightning saves of the module
    finally:
        run.collector.close()
        run.engine.close()
    ckpt = tmp_path / "train" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"state_dict": moved}, ckpt)
    training_config = (tmp_path / "train" / "config.yaml").read_text()

    seen = _WeightsAtValidation()
    metrics = evaluate(_compose(f"run_dir={tmp_path / 'eval'}", f"ckpt_path={ckpt}"), callbacks=[seen])
    assert 0.0 <= metrics["val/success"] <= 1.0
    for name, value in seen.weights.items():
        torch.testing.assert_close(value, moved[f"actor.{name}"])  # the checkpoint's weights, not the warm start's
    assert (tmp_path / "eval" / "metrics.jsonl").is_file()
    # the training run's folder is untouched: no metrics added, its config kept
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == ["checkpoints", "config.yaml"]
    assert (tmp_path / "train" / "config.yaml").read_text() == training_config


def test_evaluate_refuses_a_missing_checkpoint_or_the_checkpoints_own_folder(tmp_path):
    with pytest.raises(ConfigError, match="ckpt_path=.*does not exist"):
        evaluate(_compose(f"run_dir={tmp_path / 'eval'}", f"ckpt_path={tmp_path / 'nope.ckpt'}"))
    with pytest.raises(ConfigError, match="resume=true: progpo.evaluate resumes nothing"):
        evaluate(_compose(f"run_dir={tmp_path / 'eval'}", "resume=true"))
    (tmp_path / "empty.ckpt").write_bytes(b"")
    with pytest.raises(ConfigError, match="empty.ckpt cannot be read"):
        evaluate(_compose(f"run_dir={tmp_path / 'eval'}", f"ckpt_path={tmp_path / 'empty.ckpt'}"))
    assert not (tmp_path / "eval").exists()  # refused before anything was written
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"state_dict": {}}, ckpt)
    with pytest.raises(ConfigError, match="own folder.*run_name=run-eval"):
        evaluate(_compose(f"run_dir={tmp_path / 'run'}", f"ckpt_path={ckpt}"))
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoints"]  # nothing written there
