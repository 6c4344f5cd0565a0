"""The collector's env pool: ``warm_up`` starts the workers before a benchmark times a rollout, and batches of
other sizes (the held-out set, the training batch) re-use those workers.

The first reset of a pool starts its processes and fills their caches, so the first timed path of a benchmark would
pay it; warming up must start the very pool ``collect`` then uses and must not change what ``collect`` plays.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from toy_env import build_test_tiny, fake_room_suite  # noqa: E402

from envs.pool import EnvPool  # noqa: E402
from progpo.rollout.collector import RolloutCollector  # noqa: E402
from progpo.rollout.engines.hf_engine import HFEngine  # noqa: E402
from progpo.rollout.prompt import PromptBuilder  # noqa: E402


def _collector(policy, suite, pools: list[EnvPool]) -> RolloutCollector:
    engine = HFEngine(policy, batch_size=4, constrain_to_admissible=True)
    prompts = PromptBuilder(policy.tokenizer, history=2, max_prompt_tokens=policy.max_context - engine.max_new_tokens,
                            style=policy.prompt_style)

    def pool_factory(n: int) -> EnvPool:
        pools.append(EnvPool(suite.env_factory, n, 1))  # a real worker process, as a training run has
        return pools[-1]

    return RolloutCollector(suite, engine, prompts, pool_factory, max_steps=4)


def _played(turns) -> list[tuple]:
    return [(t.traj, t.t, tuple(t.prompt_ids), tuple(t.response_ids), t.reward) for t in turns]


def test_warm_up_starts_the_pool_collect_uses_and_leaves_the_rollout_unchanged():
    policy, suite = build_test_tiny(), fake_room_suite()
    tasks = suite.train_tasks[:3]
    warmed_pools: list[EnvPool] = []
    warmed = _collector(policy, suite, warmed_pools)
    cold_pools: list[EnvPool] = []
    cold = _collector(policy, suite, cold_pools)
    try:
        seconds = warmed.warm_up(tasks, 2)
        assert seconds > 0
        assert len(warmed_pools) == 1 and warmed_pools[0].num_envs == 6
        workers = warmed_pools[0].worker_pids
        assert all(pid is not None for pid in workers)
        torch.manual_seed(0)
        after_warm_up = warmed.collect(tasks, 2)
        assert len(warmed_pools) == 1 and warmed_pools[0].worker_pids == workers  # the same workers, not new ones
        torch.manual_seed(0)
        without = cold.collect(tasks, 2)
        assert after_warm_up.turns and _played(after_warm_up.turns) == _played(without.turns)
    finally:
        warmed.close()
        cold.close()


def test_batches_of_other_sizes_share_one_pool_and_play_as_a_fresh_one():
    policy, suite = build_test_tiny(), fake_room_suite()
    shared_pools: list[EnvPool] = []
    shared = _collector(policy, suite, shared_pools)
    fresh_pools: list[EnvPool] = []
    fresh = _collector(policy, suite, fresh_pools)
    try:
        held_out = shared.collect(suite.eval_tasks[:2], 1, temperature=1.0)  # an evaluation-sized batch first
        workers = shared_pools[0].worker_pids
        torch.manual_seed(0)
        train = shared.collect(suite.train_tasks[:3], 2)
        assert len(shared_pools) == 1 and shared_pools[0].worker_pids == workers and shared_pools[0].num_envs == 6
        assert len(held_out.episodes) == 2 and len(train.episodes) == 6
        torch.manual_seed(0)
        alone = fresh.collect(suite.train_tasks[:3], 2)
        assert train.turns and _played(train.turns) == _played(alone.turns)
    finally:
        shared.close()
        fresh.close()
    assert all(pid is None for pid in shared_pools[0].worker_pids)  # close stops the one pool's workers
