"""End-to-end training on the real stack with the tiny settings (`experiment=fast_dev`)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from processes import kill_when

from progpo.train import train

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def _cfg(tmp_path: Path, *overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(
            config_name="config",
            overrides=["experiment=fast_dev", "logger=none", f"run_dir={tmp_path / 'run'}", *overrides],
        )


@pytest.mark.slow
@pytest.mark.parametrize("credit", ["grpo", "gigpo", "hgpo", "progpo"])
def test_fast_dev_run_each_estimator(tmp_path, credit):
    # A 12-demo warm start on 6-step episodes often wins nothing, and then every advantage is 0 and the first KL
    # gradient too (actor == reference): a small entropy bonus on every step (none skipped) makes "the update moved
    # the actor" independent of luck.
    metrics, run = train(_cfg(tmp_path, f"credit={credit}", "ppo.entropy_coef=0.01",
                              "ppo.skip_zero_advantage=false"))
    assert metrics["iterations"] == 1
    for key in ("train/success", "val/success", "start/success", "loss/policy", "loss/kl", "perf/rollout_s",
                "perf/credit_s", "perf/update_s", "train/episode_length", "train/invalid_rate"):
        assert key in metrics, key
    assert 0.0 <= metrics["val/success"] <= 1.0
    # the HF engine samples with the actor itself: its log-probs are the trainer's old log-probs
    assert metrics["rollout/logprob_diff_mean"] < 1e-5 and metrics["rollout/logprob_diff_max"] < 1e-3
    assert 0.0 <= metrics["rollout/sampler_kl"] < 1e-6
    assert (run.run_dir / "checkpoints" / "last.ckpt").is_file()
    summary = (run.run_dir / "summary.md").read_text()
    assert summary.startswith("| task type")
    _check_time_table(summary, _rows(run.run_dir / "metrics.jsonl"))
    if credit == "progpo":
        for key in ("peer_zero", "transition_active", "transition_only", "still_zero", "multi_depth"):
            assert f"credit/{key}" in metrics
    # the actor moved away from the frozen reference (the warm-started weights)
    actor = dict(run.module.actor.named_parameters())
    reference = dict(run.module.rl.reference.named_parameters())
    changed = [name for name, p in actor.items() if not torch.equal(p.detach().cpu(), reference[name].cpu())]
    assert changed, "no parameter changed after an update"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _check_time_table(summary: str, rows: list[dict]) -> None:
    """The summary's time table: each part the sum of the run's logged seconds, and parts that add up to the total."""
    table = summary[summary.index("| time |"):]
    seconds = {}
    for line in table.splitlines()[2:]:
        label, value, _ = (cell.strip() for cell in line.strip("|").split("|"))
        seconds[label] = float(value)
    iterations = [row for row in rows if "perf/rollout_s" in row]
    evaluations = [row["perf/val_rollout_s"] for row in rows if "perf/val_rollout_s" in row]
    update = sum(row["perf/update_s"] for row in iterations)
    assert seconds[f"RL iterations ({len(iterations)})"] > 0
    assert seconds["- update"] == pytest.approx(update, abs=0.05)
    assert seconds[f"held-out evaluation ({len(evaluations)})"] == pytest.approx(sum(evaluations), abs=0.05)
    parts = sum(value for label, value in seconds.items() if not label.startswith(("- ", "**total**")))
    assert seconds["**total** (build to summary)"] == pytest.approx(parts, abs=0.25)
    assert seconds["build (tracking store, env suite, model, engine)"] > 0
    assert seconds["checkpoints, logging, plots, the rest"] >= 0  # every timed part lies inside the total


@pytest.mark.slow
def test_sigkill_then_resume_continues_at_next_iteration(tmp_path):
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "progpo.train", "experiment=fast_dev", "logger=none", f"run_dir={run_dir}",
            "schedule.max_iterations=3", "eval.every=10", f"hydra.run.dir={tmp_path / 'hydra'}"]
    env = dict(os.environ)
    last = run_dir / "checkpoints" / "last.ckpt"

    def iteration_saved() -> bool:
        return last.exists() and torch.load(last, map_location="cpu", weights_only=False)["progpo"][
            "iterations_done"] >= 1

    kill_when(args, tmp_path, env, iteration_saved)
    state = torch.load(last, map_location="cpu", weights_only=False)
    done_at_kill = state["progpo"]["iterations_done"]
    assert 1 <= done_at_kill < 3
    config_before = (run_dir / "config.yaml").read_text()

    resumed = subprocess.run(args + ["resume=true"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    output = resumed.stderr + resumed.stdout
    assert f"resuming from {last}" in output
    assert "resumed with the same config as the checkpointed run" in output
    assert (run_dir / "config.yaml").read_text() == config_before
    rows = _rows(run_dir / "metrics.jsonl")
    train_steps = [int(r["step"]) for r in rows if "train/success" in r]
    assert train_steps == [1, 2, 3], train_steps  # nothing lost, nothing duplicated
    assert any("val/success" in r and int(r["step"]) == 0 for r in rows)  # the start evaluation survived
    final = torch.load(last, map_location="cpu", weights_only=False)
    assert final["progpo"]["iterations_done"] == 3
    assert final["RolloutDataModule"] == {"iterations_done": 3}  # the task stream continued where it stopped


@pytest.mark.slow
def test_a_resumed_run_reproduces_the_uninterrupted_one(tmp_path):
    """Stop after iteration 1, resume to 2: iteration 2 plays the same tasks with the same RNG state, so on CPU
    its metrics equal the uninterrupted run's (tolerance 1e-6: float round-off, nothing else may differ)."""
    common = ["ppo.skip_zero_advantage=false", "ppo.entropy_coef=0.01", "eval.every=1", "torch_threads=1"]
    straight = tmp_path / "straight"
    train(_cfg(straight, "schedule.max_iterations=2", *common))
    resumed = tmp_path / "resumed"
    train(_cfg(resumed, "schedule.max_iterations=1", *common))
    train(_cfg(resumed, "schedule.max_iterations=2", "resume=true", *common))

    def iteration(path: Path, step: int) -> dict:
        rows = [r for r in _rows(path / "run" / "metrics.jsonl") if "train/success" in r and r["step"] == step]
        assert len(rows) == 1
        return rows[0]

    a, b = iteration(straight, 2), iteration(resumed, 2)
    compared = [k for k in a if not k.startswith("perf/")]  # timings differ, everything else must not
    assert {"train/steps", "train/success", "loss/policy", "loss/kl", "train/advantage_abs_mean"} <= set(compared)
    for key in compared:
        assert b[key] == pytest.approx(a[key], abs=1e-6), key


@pytest.mark.slow
def test_bf16_mixed_on_cpu_runs_generation_scoring_and_update_in_bf16_with_float32_state(tmp_path):
    """``trainer.precision=bf16-mixed``: Lightning's CPU autocast covers the whole iteration (rollout, scoring, update);
    the weights, the optimizer state, the log-probs and the loss stay float32."""
    import lightning as L

    seen: dict[str, set] = {"head": set()}

    class Inspect(L.Callback):
        def on_train_start(self, trainer, pl_module):
            head = pl_module.actor.get_output_embeddings()
            head.register_forward_hook(lambda mod, args, out: seen["head"].add(out.dtype))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            optimizer = trainer.optimizers[0]
            seen["state"] = {v.dtype for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)
                             and v.dim() > 0}
            seen["params"] = {p.dtype for p in pl_module.actor.parameters()}
            seen["metrics"] = outputs["result"].metrics

    metrics, _ = train(_cfg(tmp_path, "trainer.precision=bf16-mixed", "ppo.entropy_coef=0.01",
                            "ppo.skip_zero_advantage=false"), callbacks=[Inspect()])
    assert seen["head"] == {torch.bfloat16}  # every LM-head call of the iteration ran under bf16 autocast
    assert seen["params"] == {torch.float32} and seen["state"] == {torch.float32}
    for key in ("loss/total", "loss/kl", "train/success", "val/success"):
        assert math.isfinite(metrics[key]), key
