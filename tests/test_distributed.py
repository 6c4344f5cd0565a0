"""Two ranks on CPU (gloo, Lightning's DDP) against one process, on the tiny model at fast_dev sizes.

One process plays an iteration and records its rollouts; two ranks replay them, each its share of the task
groups (``tests/distributed_worker.py``). The 2-rank run must then hold identical parameters on both ranks, equal
the 1-rank update (SGD, so a parameter difference is the learning rate times a gradient difference), log the same
metrics and compute the same credit with ``sem_scope=batch`` (semantic neighbours across the ranks' groups). A
second test SIGKILLs a 2-rank ``python -m progpo.train`` after its first checkpoint and resumes it. Wall-clock on
2 shared CPU cores: ~40 s for the recording process, ~30-40 s for the 2-rank replay.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from distributed import kill_ranks_when, log_tail, run_ranks
from hydra import compose, initialize_config_dir

from progpo.config import ConfigError, TrainerConfig, validate_config
from progpo.dist import shard

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "tests" / "distributed_worker.py")
# 3 tasks: uneven shares (2 + 1 groups), so a rank runs empty micro-batches in some minibatches.
COMMON = ["experiment=fast_dev", "logger=none", "credit=progpo", "credit.sem_scope=batch", "rollout.tasks_per_batch=3",
          "optim._target_=torch.optim.SGD", "optim.lr=0.05", "ppo.micro_batch_size=4", "ppo.minibatch_size=8",
          "ppo.entropy_coef=0.01", "ppo.skip_zero_advantage=false", "torch_threads=1"]
DDP = ["trainer.devices=2", "trainer.strategy=ddp"]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _worker(tmp: Path, name: str, world: int, overrides: list[str], **spec) -> Path:
    folder = tmp / name
    spec_path = tmp / f"{name}.json"
    spec_path.write_text(json.dumps({"overrides": [*COMMON, f"run_dir={folder / 'run'}", *overrides],
                                     "dump": str(folder / "dump"), **spec}))
    codes = run_ranks(lambda rank: [sys.executable, WORKER, str(spec_path)], world, ROOT, _env(), folder / "logs")
    assert codes == [0] * world, log_tail(folder / "logs")
    return folder


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    recording = tmp / "rollouts.pkl"
    one = _worker(tmp, "one", 1, [], record=str(recording))
    two = _worker(tmp, "two", 2, DDP, replay=str(recording))
    return one, two


@pytest.mark.slow
def test_two_ranks_hold_identical_parameters_equal_to_one_process(runs):
    one, two = runs
    start = torch.load(one / "dump" / "params-start.pt")
    p1 = torch.load(one / "dump" / "params-rank0.pt")
    r0, r1 = (torch.load(two / "dump" / f"params-rank{r}.pt") for r in (0, 1))
    assert _max_diff(r0, r1) == 0.0  # (a) DDP: both ranks took the same steps
    moved = _max_diff(p1, start)
    assert moved > 1e-4, "the update did not move the actor; the comparison would be empty"
    assert _max_diff(r0, p1) < 1e-5, f"2-rank vs 1-rank update differs by {_max_diff(r0, p1):.3g} (moved {moved:.3g})"


@pytest.mark.slow
def test_two_ranks_log_the_metrics_of_one_process(runs):
    one, two = runs
    rows1, rows2 = _rows(one), _rows(two)
    assert [r["step"] for r in rows1] == [r["step"] for r in rows2]
    for a, b in zip(rows1, rows2):
        keys = {k for k in a if not k.startswith("perf/")}
        assert keys == {k for k in b if not k.startswith("perf/")}
        for key in keys:
            assert math.isclose(a[key], b[key], rel_tol=1e-5, abs_tol=1e-6), (key, a[key], b[key])
    train = next(r for r in rows2 if "train/success" in r)
    assert train["train/steps"] > 0 and "credit/transition_active" in train


@pytest.mark.slow
def test_batch_scope_semantic_credit_on_two_ranks_equals_one_process(runs):
    one, two = runs
    full = torch.load(one / "dump" / "credit-1-rank0.pt")
    shares = [torch.load(two / "dump" / f"credit-1-rank{r}.pt") for r in (0, 1)]
    assert shares[0] and shares[1] and not shares[0].keys() & shares[1].keys()  # each rank its own groups
    merged = {**shares[0], **shares[1]}
    assert merged.keys() == full.keys()
    assert max(abs(merged[k] - full[k]) for k in full) < 1e-5
    assert any(abs(v) > 1e-6 for v in full.values())


def _last_iteration(path: Path) -> int:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)["progpo"]["iterations_done"]
    except Exception:  # not written yet
        return 0


@pytest.mark.slow
def test_two_ranks_sigkilled_then_resumed_continue_and_refuse_another_world_size(tmp_path):
    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.ckpt"

    def args(*extra: str):
        return lambda rank: [sys.executable, "-m", "progpo.train", "experiment=fast_dev", "logger=none",
                             f"run_dir={run_dir}", "schedule.max_iterations=2", "eval.every=10", "torch_threads=1",
                             f"hydra.run.dir={tmp_path / f'hydra-{rank}'}", *extra]

    kill_ranks_when(args(*DDP), 2, ROOT, _env(), tmp_path / "logs-killed", lambda: _last_iteration(last) >= 1)
    done_at_kill = _last_iteration(last)
    assert done_at_kill == 1

    one_rank = subprocess.run(args("trainer.devices=1", "resume=true")(0), cwd=ROOT, env=_env(), capture_output=True,
                              text=True, timeout=300)
    assert one_rank.returncode == 2
    assert "world size 2" in one_rank.stderr + one_rank.stdout and "world size 1" in one_rank.stderr + one_rank.stdout

    codes = run_ranks(args(*DDP, "resume=true"), 2, ROOT, _env(), tmp_path / "logs-resumed")
    assert codes == [0, 0], log_tail(tmp_path / "logs-resumed")
    state = torch.load(last, map_location="cpu", weights_only=False)
    assert state["progpo"]["iterations_done"] == 2 and state["world_size"] == 2
    assert len(state["rng"]) == 2  # every rank's RNG states
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if "train/success" in json.loads(line)]
    assert steps == [1.0, 2.0]


def test_shares_are_contiguous_cover_everything_and_differ_by_at_most_one():
    for n, world in ((3, 2), (16, 4), (5, 3), (2, 2)):
        shares = [shard(n, r, world) for r in range(world)]
        assert shares[0][0] == 0 and shares[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))
        sizes = [stop - start for start, stop in shares]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_world_size_is_devices_times_nodes_and_must_not_exceed_the_tasks():
    assert TrainerConfig(devices=2, num_nodes=3).world_size == 6
    assert TrainerConfig(devices=[0, 1, 2]).world_size == 3
    assert TrainerConfig(devices="0,1").world_size == 2
    assert TrainerConfig(devices="auto").world_size == 1  # CPU: one process
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=fast_dev", "trainer.devices=4"])
    with pytest.raises(ConfigError, match="rollout.tasks_per_batch"):
        validate_config(cfg)
