"""CUDA matches CPU (gpu marker), and the benchmark command runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from progpo.bench.cli import main as bench_main
from progpo.bench.credit import synthetic_batch
from progpo.credit import GRPO, HGPO, GiGPO, ProGPO, StepBatch

from .batches import random_arrays


@pytest.mark.gpu
@pytest.mark.parametrize(
    "estimator",
    [
        GRPO(),
        GiGPO(),
        HGPO(),
        ProGPO(),
        ProGPO(sem_scope="batch"),
        ProGPO(fusion="single", history=3),
        ProGPO(knn_backend="faiss"),
    ],
    ids=repr,
)
def test_cuda_matches_cpu(estimator):
    for seed in range(5):
        arrays = random_arrays(
            np.random.default_rng(seed), n_groups=6, max_rollouts=8, max_len=20, vocab=10, dim=32
        )
        cpu = StepBatch(**arrays.fields())
        gpu = cpu.to("cuda")
        a, b = estimator(cpu), estimator(gpu)
        assert b.advantage.device.type == "cuda" and b.returns.device.type == "cuda"
        torch.testing.assert_close(b.advantage.cpu(), a.advantage, atol=1e-9, rtol=0)
        torch.testing.assert_close(b.returns.cpu(), a.returns, atol=1e-12, rtol=0)
        assert b.stats == pytest.approx(a.stats, abs=1e-12)


@pytest.mark.gpu
def test_cuda_paper_scale_batch():
    cpu = synthetic_batch(dim=256)
    a, b = ProGPO()(cpu), ProGPO()(cpu.to("cuda"))
    torch.testing.assert_close(b.advantage.cpu(), a.advantage, atol=1e-6, rtol=0)


def test_synthetic_batch_has_state_recurrence():
    batch = synthetic_batch(n_tasks=4, dim=8)
    assert batch.layout.n_traj == 32 and batch.layout.n_groups == 4
    states = torch.unique(batch.group * 10_000 + batch.obs).numel()
    assert states < batch.n / 3  # observations are revisited across rollouts
    result = ProGPO()(batch)
    assert 0.0 < result.stats["transition_active"] < 1.0 and result.stats["multi_depth"] > 0.0


def test_bench_credit_command_runs(capsys):
    bench_main(["credit", "--scales", "1", "--dim", "8", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "ProGPO" in out and "steps/s" in out and "1x" in out
