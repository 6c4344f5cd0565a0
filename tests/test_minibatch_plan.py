"""The update's minibatch plan (``progpo.algo.ppo.minibatch_plan``) against its definition, on synthetic turns.

Identical turns form one unit that is permuted as a whole, so its copies share a minibatch (and a forward pass);
without copies the plan is a plain seeded permutation of the steps, cut every ``minibatch_size``.
"""

from __future__ import annotations

import random

import pytest
import torch

from progpo.algo.ppo import minibatch_order, minibatch_plan
from progpo.algo.scoring import turn_content
from progpo.config import PPOConfig
from progpo.types import Turn


def _turn(traj: int, t: int, prompt: list[int], response: list[int]) -> Turn:
    return Turn(traj=traj, group=traj // 4, t=t, prompt_ids=prompt, response_ids=response,
                sample_logprobs=[0.0] * len(response), obs_id=0, response_text="", action="", valid=True,
                reward=0.0, allowed_token_ids=[[r, r + 1] for r in response])


def _batch(copies: bool, seed: int = 0) -> list[Turn]:
    """4 groups x 4 trajectories x 5 steps; with ``copies`` every group's trajectories open with the same turn."""
    rng = random.Random(seed)
    turns = []
    for traj in range(16):
        for t in range(5):
            if copies and t == 0:
                prompt, response = [1, 2, traj // 4], [7, 8]
            else:
                prompt = [rng.randrange(50) for _ in range(rng.randrange(3, 9))]
                response = [rng.randrange(50) for _ in range(rng.randrange(1, 4))]
            turns.append(_turn(traj, t, prompt, response))
    return turns


def _plain_plan(turns: list[Turn], trainable: list[int], cfg: PPOConfig, seed: int, iteration: int) -> list[set[int]]:
    """The definition: steps in canonical (trajectory, step) order; identical turns make one unit, units numbered
    by first appearance; a seeded permutation of the units, each expanded to its steps; consecutive cuts."""
    canonical = sorted(trainable, key=lambda i: (turns[i].traj, turns[i].t))
    units: dict[tuple, list[int]] = {}
    for i in canonical:
        units.setdefault(turn_content(turns[i]), []).append(i)
    members = list(units.values())
    out = []
    for epoch in range(cfg.epochs):
        order = [i for u in minibatch_order(list(range(len(members))), seed, iteration * cfg.epochs + epoch)
                 for i in members[u]]
        out += [set(order[s : s + cfg.minibatch_size]) for s in range(0, len(order), cfg.minibatch_size)]
    return out


@pytest.mark.parametrize("iteration", [0, 3])
def test_without_copies_the_plan_is_the_plain_seeded_permutation(iteration):
    turns = _batch(copies=False)
    trainable = list(range(0, len(turns), 1))[::-1][5:]  # any subset, in any order
    cfg = PPOConfig(epochs=2, minibatch_size=16, micro_batch_size=4)
    plan = minibatch_plan(turns, trainable, cfg, seed=7, iteration=iteration)
    assert [set(mb.steps) for mb in plan] == _plain_plan(turns, trainable, cfg, seed=7, iteration=iteration)
    for mb in plan:
        assert mb.tokens == sum(len(turns[i].response_ids) for i in mb.steps)
        assert mb.micro_batches == -(-len(mb.steps) // cfg.micro_batch_size)
        lengths = [len(turns[i].prompt_ids) + len(turns[i].response_ids) for i in mb.steps]
        assert lengths == sorted(lengths)  # shortest first: a micro-batch pads little


def test_copies_land_in_one_minibatch_side_by_side_and_every_step_once_per_epoch():
    turns = _batch(copies=True)
    trainable = list(range(len(turns)))
    cfg = PPOConfig(epochs=3, minibatch_size=12, micro_batch_size=4)
    plan = minibatch_plan(turns, trainable, cfg, seed=1, iteration=2)
    assert [set(mb.steps) for mb in plan] == _plain_plan(turns, trainable, cfg, seed=1, iteration=2)
    per_epoch = len(plan) // cfg.epochs
    for epoch in range(cfg.epochs):
        steps = [i for mb in plan[epoch * per_epoch : (epoch + 1) * per_epoch] for i in mb.steps]
        assert sorted(steps) == trainable
    for mb in plan:
        assert all(len(mb.steps) <= cfg.minibatch_size for mb in plan)
        contents = [turn_content(turns[i]) for i in mb.steps]
        for content in set(contents):
            at = [k for k, c in enumerate(contents) if c == content]
            assert at == list(range(at[0], at[0] + len(at)))  # copies are adjacent, so they share a micro-batch
    # the 4 copies of each group's opening turn are consecutive in the order: one minibatch, or two neighbours
    # when a cut falls inside them
    openings = [[g * 20 + k * 5 for k in range(4)] for g in range(4)]
    for group in openings:
        holders = sorted(n for n, mb in enumerate(plan[:per_epoch]) if set(group) & set(mb.steps))
        assert holders == list(range(holders[0], holders[0] + len(holders))) and len(holders) <= 2
    # epochs and iterations draw different orders
    assert [mb.steps for mb in plan[:per_epoch]] != [mb.steps for mb in plan[per_epoch : 2 * per_epoch]]


def test_content_hash_is_the_same_in_another_process():
    """Ranks compare turns by ``hash(turn_content)``: it must not depend on the process (no str or None inside)."""
    import subprocess
    import sys

    turn = _batch(copies=True)[0]
    code = ("from progpo.algo.scoring import turn_content; from progpo.types import Turn; "
            f"t = Turn(traj=0, group=0, t=0, prompt_ids={turn.prompt_ids}, response_ids={turn.response_ids}, "
            f"sample_logprobs=[0.0, 0.0], obs_id=0, response_text='', action='', valid=True, reward=0.0, "
            f"allowed_token_ids={turn.allowed_token_ids}); print(hash(turn_content(t)))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", **__import__("os").environ})
    assert int(other.stdout) == hash(turn_content(turn))
    free = Turn(traj=0, group=0, t=0, prompt_ids=[1], response_ids=[2], sample_logprobs=[0.0], obs_id=0,
                response_text="", action="", valid=True, reward=0.0, allowed_token_ids=None)
    assert turn_content(free) == ((1,), (2,), ())
    assert torch.tensor([hash(turn_content(free))], dtype=torch.long).item() == hash(turn_content(free))
