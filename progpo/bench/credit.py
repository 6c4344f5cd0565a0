"""``python -m progpo.bench credit`` and ``python -m progpo.bench knn``: the credit estimators' wall time.

``credit``: builds a paper-scale synthetic rollout batch (16 tasks x 8 rollouts x up to 50 steps, realistic
state recurrence, 1536-dim float32 embeddings) and prints, for every credit estimator, the median wall time
of one call and the steps/s at 1x, 2x and 8x that size (more tasks, same rollouts per task).

The synthetic batch imitates ALFWorld: each task has a small observation vocabulary with a Zipf-like
revisit distribution, all rollouts of a task start from the same observation, ~15% of observations come
from a pool shared by all tasks ("Nothing happens."), successful rollouts stop early with reward 10,
failed ones run to 50 steps, and ~5% of actions are invalid (-0.1). Embeddings are a per-observation
vector plus per-step noise, so equal observations have close but not identical hidden states.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from progpo.credit import GRPO, HGPO, GiGPO, ProGPO, StepBatch

__all__ = ["add_parsers", "bench_credit", "bench_knn", "synthetic_batch"]


def synthetic_batch(
    n_tasks: int = 16,
    rollouts: int = 8,
    max_steps: int = 50,
    dim: int = 1536,
    vocab: int = 40,
    shared_vocab: int = 8,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> StepBatch:
    """A paper-scale rollout batch with realistic state recurrence (see the module docstring)."""
    rng = np.random.default_rng(seed)
    group, traj, t_idx, obs, reward = [], [], [], [], []
    zipf = 1.0 / np.arange(1, vocab + 1) ** 1.1
    zipf /= zipf.sum()
    shared = np.arange(shared_vocab)
    tr = 0
    for task in range(n_tasks):
        local = shared_vocab + task * vocab + np.arange(vocab)
        p_success = rng.uniform(0.0, 1.0)
        for _ in range(rollouts):
            success = rng.random() < p_success
            length = int(rng.integers(8, max_steps + 1)) if success else max_steps
            o = np.where(
                rng.random(length) < 0.15,
                rng.choice(shared, size=length),
                rng.choice(local, size=length, p=zipf),
            )
            o[0] = local[0]
            r = np.where(rng.random(length) < 0.05, -0.1, 0.0)
            if success:
                r[-1] += 10.0
            group.append(np.full(length, task))
            traj.append(np.full(length, tr))
            t_idx.append(np.arange(length))
            obs.append(o)
            reward.append(r)
            tr += 1
    cat = np.concatenate
    group, traj, t_idx, obs, reward = cat(group), cat(traj), cat(t_idx), cat(obs), cat(reward)
    perm = rng.permutation(len(group))
    gen = torch.Generator().manual_seed(seed)
    n_obs = shared_vocab + n_tasks * vocab
    base = torch.randn(n_obs, dim, generator=gen)
    obs_t = torch.from_numpy(obs[perm])
    embedding = base[obs_t].add_(torch.randn(len(perm), dim, generator=gen), alpha=0.5)
    return StepBatch(
        group=torch.from_numpy(group[perm]).to(device),
        traj=torch.from_numpy(traj[perm]).to(device),
        t=torch.from_numpy(t_idx[perm]).to(device),
        obs=obs_t.to(device),
        reward=torch.from_numpy(reward[perm]).to(device),
        embedding=embedding.to(device),
    )


def _timings_ms(fn: Callable[[], object], repeats: int, device: torch.device) -> tuple[float, float]:
    """(median, min) wall time of ``fn`` in ms after one warm-up call."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, min(times) * 1e3


def bench_credit(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    estimators = {
        "GRPO": GRPO(),
        "GiGPO": GiGPO(),
        "HGPO": HGPO(),
        "ProGPO (no embeddings)": ProGPO(min_value_group=0),
        "ProGPO": ProGPO(knn_backend=args.knn_backend),
    }
    out = sys.stdout
    out.write(
        f"credit estimators on {device}, torch threads: {torch.get_num_threads()}, "
        f"embedding dim {args.dim}, median of {args.repeats} calls at 1x (fewer at larger scales), "
        f"load average {os.getloadavg()[0]:.2f}\n"
    )
    header = f"{'estimator':<24}{'scale':>6}{'steps':>8}{'median ms':>11}{'min ms':>9}{'steps/s':>12}\n"
    out.write(header)
    out.write("-" * (len(header) - 1) + "\n")
    for scale in args.scales:
        batch = synthetic_batch(n_tasks=16 * scale, dim=args.dim, seed=args.seed, device=device)
        repeats = max(3, args.repeats // scale)
        fields = {k: getattr(batch, k) for k in ("group", "traj", "t", "obs", "reward", "embedding")}
        rows = [("StepBatch (validate)", lambda fields=fields: StepBatch(**fields))]
        rows += [(name, lambda est=est, batch=batch: est(batch)) for name, est in estimators.items()]
        for name, fn in rows:
            median, best = _timings_ms(fn, repeats, device)
            out.write(
                f"{name:<24}{scale:>5}x{batch.n:>8}{median:>11.2f}{best:>9.2f}{batch.n / median * 1e3:>12,.0f}\n"
            )
        n_states = torch.unique(batch.group * (int(batch.obs.max()) + 1) + batch.obs).numel()
        out.write(f"{'':<24}{'':>6}{'':>8}  ({batch.layout.n_traj} rollouts, {n_states} distinct states)\n")
        out.flush()


def bench_knn(args: argparse.Namespace) -> None:
    """ProGPO with the exact torch search against faiss, same batches, one run: the ratio decides ``auto``."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    out = sys.stdout
    out.write(f"ProGPO semantic search on {device}, torch threads {torch.get_num_threads()}, "
              f"load average {os.getloadavg()[0]:.2f}\n")
    header = f"{'scope':<7}{'dim':>6}{'scale':>6}{'steps':>8}{'torch ms':>10}{'faiss ms':>10}{'faiss/torch':>13}\n"
    out.write(header + "-" * (len(header) - 1) + "\n")
    for scope in ("group", "batch"):
        for dim in args.dims:
            for scale in args.scales:
                batch = synthetic_batch(n_tasks=16 * scale, dim=dim, seed=args.seed, device=device)
                repeats = max(3, args.repeats // scale)
                ms = {}
                for backend in ("torch", "faiss"):
                    est = ProGPO(knn_backend=backend, sem_scope=scope)
                    ms[backend], _ = _timings_ms(lambda est=est, batch=batch: est(batch), repeats, device)
                out.write(f"{scope:<7}{dim:>6}{scale:>5}x{batch.n:>8}{ms['torch']:>10.2f}{ms['faiss']:>10.2f}"
                          f"{ms['faiss'] / ms['torch']:>13.2f}\n")
                out.flush()


def add_parsers(sub) -> None:
    """The ``credit`` and ``knn`` subcommands."""
    credit = sub.add_parser("credit", help="time the credit estimators on a paper-scale synthetic batch")
    credit.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    credit.add_argument("--scales", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 8])
    credit.add_argument("--repeats", type=int, default=40, help="timed calls at 1x (fewer at larger scales)")
    credit.add_argument("--dim", type=int, default=1536, help="embedding dimension")
    credit.add_argument("--knn-backend", default="auto", choices=["auto", "torch", "faiss"])
    credit.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    credit.add_argument("--seed", type=int, default=0)
    credit.set_defaults(run=bench_credit)
    knn = sub.add_parser("knn", help="ProGPO's semantic search: exact torch against faiss, as a ratio")
    knn.add_argument("--device", default="cpu")
    knn.add_argument("--scales", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    knn.add_argument("--dims", type=lambda s: [int(x) for x in s.split(",")], default=[256, 1536])
    knn.add_argument("--repeats", type=int, default=20)
    knn.add_argument("--threads", type=int, default=0)
    knn.add_argument("--seed", type=int, default=0)
    knn.set_defaults(run=bench_knn)
