"""One rank of a test run: ``python tests/distributed_worker.py SPEC.json`` (see ``tests/distributed.py``).

Composes the real config with the spec's overrides, builds the run with ``progpo.train.build`` and fits it. The
collector can record what it played (``record``: every call's batch, pickled) or replay a recording (``replay``):
each rank then gets, for its share of the tasks, exactly the turns a one-process run played, so a 2-rank run and a
1-rank run update on the same rollouts. ``dump``: a folder for this rank's final parameters and per-step credit.
"""

from __future__ import annotations

import json
import pickle
import sys
from dataclasses import replace
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir

from progpo import dist
from progpo.train import build, fit
from progpo.types import RolloutBatch

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def share(batch: RolloutBatch, first_group: int, n_groups: int) -> RolloutBatch:
    """The turns and episodes of groups ``[first_group, first_group + n_groups)``, in the order played;
    throughput counts are those of the share (so a recording and its replays count alike)."""
    keep = range(first_group, first_group + n_groups)
    turns = [t for t in batch.turns if t.group in keep]
    return RolloutBatch(turns=turns, episodes=[e for e in batch.episodes if e.group in keep],
                        rollout_seconds=batch.rollout_seconds,
                        generated_tokens=sum(len(t.response_ids) for t in turns), env_steps=len(turns))


def with_wins(batch: RolloutBatch) -> RolloutBatch:
    """Every third trajectory wins at its last step (reward 1): a warm start this small rarely wins by itself, and
    all-zero rewards would make every advantage 0 and the credit comparison empty."""
    last = {}
    for k, turn in enumerate(batch.turns):
        last[turn.traj] = k
    winners = {traj for traj in last if traj % 3 == 0}
    turns = [replace(t, reward=1.0) if t.traj in winners and last[t.traj] == k else t
             for k, t in enumerate(batch.turns)]
    episodes = [replace(e, won=True) if e.traj in winners else e for e in batch.episodes]
    return replace(batch, turns=turns, episodes=episodes)


class RecordingCollector:
    """The real collector with scripted wins (``with_wins``); every batch it returns is also kept (``save``
    pickles them, in call order)."""

    def __init__(self, real) -> None:
        self.real = real
        self.batches: list[RolloutBatch] = []

    def collect(self, tasks, group_size, greedy=False, temperature=None, first_group=0):
        batch = self.real.collect(tasks, group_size, greedy=greedy, temperature=temperature, first_group=first_group)
        batch = with_wins(share(batch, first_group, len(tasks)))
        self.batches.append(batch)
        return batch

    def save(self, path: Path) -> None:
        path.write_bytes(pickle.dumps(self.batches))

    def close(self) -> None:
        self.real.close()


class ReplayCollector:
    """Replays a recording: call k returns this rank's share of the k-th recorded batch."""

    def __init__(self, path: Path) -> None:
        self.batches = pickle.loads(Path(path).read_bytes())
        self.calls = 0

    def collect(self, tasks, group_size, greedy=False, temperature=None, first_group=0):
        batch = self.batches[self.calls]
        self.calls += 1
        return share(batch, first_group, len(tasks))

    def close(self) -> None:
        pass


class DumpCredit(L.Callback):
    """Each iteration's advantage per (trajectory, step) of this rank."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        result = outputs["result"]
        keys = [(t.traj, t.t) for t in result.batch.turns]
        rows = dict(zip(keys, result.credit.advantage.tolist()))
        torch.save(rows, self.folder / f"credit-{result.iteration}-rank{trainer.global_rank}.pt")


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    dump = Path(spec["dump"]) if spec.get("dump") else None
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=spec["overrides"])
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
    run = build(cfg, callbacks=[DumpCredit(dump)] if dump is not None else [])
    collector = run.collector
    if spec.get("record"):
        collector = RecordingCollector(run.collector)
    elif spec.get("replay"):
        run.collector.close()
        collector = ReplayCollector(Path(spec["replay"]))
    run.module.rl.collector = collector
    run = replace(run, collector=collector)
    if dump is not None and dist.launch_rank() == 0:
        torch.save({name: p.detach().clone() for name, p in run.module.actor.named_parameters()},
                   dump / "params-start.pt")
    fit(run)
    if spec.get("record"):
        collector.save(Path(spec["record"]))
    if dump is not None:
        params = {name: p.detach().clone() for name, p in run.module.actor.named_parameters()}
        torch.save(params, dump / f"params-rank{dist.launch_rank()}.pt")


if __name__ == "__main__":
    main(sys.argv[1])
