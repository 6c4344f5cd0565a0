"""The iteration's contract with the engine: exactly one weight sync per iteration, after its optimizer steps.

A recording engine wraps the real HF engine of a real fast-dev run (tiny model, generated ALFWorld games), so
the order of generate / optimizer step / sync is observed on the real loop, not on a mock of it.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir

from progpo.train import build, fit

CONF = str(Path(__file__).resolve().parents[1] / "conf")


class RecordingEngine:
    """The real engine, with every generate and sync written to a shared event list."""

    def __init__(self, engine, events: list[tuple], actor: torch.nn.Module) -> None:
        self.engine, self.events, self.actor = engine, events, actor
        self.max_new_tokens = engine.max_new_tokens

    def generate(self, *args, **kwargs):
        self.events.append(("generate",))
        return self.engine.generate(*args, **kwargs)

    def sync_weights(self, model) -> None:
        assert model is self.actor
        self.events.append(("sync", {k: v.detach().clone() for k, v in model.state_dict().items()}))
        self.engine.sync_weights(model)

    def close(self) -> None:
        self.engine.close()


class StepRecorder(L.Callback):
    def __init__(self, events: list[tuple]) -> None:
        self.events = events

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.events.append(("step",))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.events.append(("iteration_start",))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.events.append(("iteration_end", outputs["result"].iteration))


def test_one_sync_per_iteration_after_the_update(tmp_path):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=fast_dev", "logger=none", f"run_dir={tmp_path / 'run'}", "schedule.max_iterations=2",
            "eval.every=5", "ppo.skip_zero_advantage=false", "ppo.entropy_coef=0.01", "ppo.minibatch_size=4"])
    events: list[tuple] = []
    run = build(cfg, callbacks=[StepRecorder(events)])
    recording = RecordingEngine(run.engine, events, run.module.actor)
    run.engine = run.collector.engine = run.module.rl.engine = recording
    metrics = fit(run)
    assert metrics["iterations"] == 2

    kinds = [e[0] for e in events]
    starts = [i for i, k in enumerate(kinds) if k == "iteration_start"]
    ends = [i for i, k in enumerate(kinds) if k == "iteration_end"]
    assert [events[i][1] for i in ends] == [1, 2]
    assert kinds.count("sync") == 2  # none outside the iterations (evaluation, start-up)
    for begin, end in zip(starts, ends):
        window = kinds[begin:end]
        assert window.count("sync") == 1, window
        sync = window.index("sync")
        assert "generate" in window[:sync] and "step" in window[:sync]
        assert "step" not in window[sync:] and "generate" not in window[sync:]  # the sync ends the iteration
    # what the engine received is the actor's weights after that iteration's update
    synced = [e[1] for e in events if e[0] == "sync"]
    assert any(not torch.equal(a, b) for a, b in zip(synced[0].values(), synced[1].values()))
    final = run.module.actor.state_dict()
    assert all(torch.equal(final[k], v) for k, v in synced[-1].items())
