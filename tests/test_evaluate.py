"""`python -m progpo.evaluate`: one held-out evaluation of the model as built, no training."""

from __future__ import annotations

import json
from pathlib import Path

from hydra import compose, initialize_config_dir

from progpo.evaluate import evaluate

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
