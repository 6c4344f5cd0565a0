"""The tiny model's build steps on real generated ALFWorld games (TextWorld engine, offline)."""

from __future__ import annotations

import pytest

from progpo.rollout.prompt import PromptBuilder
from progpo.warmstart import WarmStartConfig, collect_demos
from progpo.warmstart.tiny import build_tiny

pytest.importorskip("alfworld")


@pytest.fixture(scope="module")
def alfworld_suite(shared_cache_dir):
    from envs.alfworld import make_suite

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROGPO_CACHE_DIR", str(shared_cache_dir))
        return make_suite(n_train=24, n_eval=6, max_steps=30)


def test_expert_demos_on_alfworld_win_with_admissible_labels(alfworld_suite):
    demos, stats = collect_demos(alfworld_suite, WarmStartConfig(n_episodes=8, action_noise=0.2, seed=0))
    assert stats.episodes == 8 and stats.won >= 6  # the expert recovers from most random detours
    assert stats.skipped_inadmissible == 0
    assert all(d.expert_action in d.admissible for d in demos)
    assert {d.episode for d in demos} == set(range(8))


def test_tokenizer_trained_on_alfworld_text_is_compact(alfworld_suite):
    env = alfworld_suite.env_factory()
    obs = env.reset(alfworld_suite.eval_tasks[0])  # held-out text: not in the tokenizer corpus
    env.close()
    policy = build_tiny(
        alfworld_suite, hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128,
        warm_start={"n_episodes": 0},
    )  # fmt: skip
    tok = policy.tokenizer
    builder = PromptBuilder(tok, history=2, style=policy.prompt_style)
    prompt = builder.build(obs.task_description, obs.text, obs.admissible_actions, [])
    words = len(prompt.text.split())
    assert len(prompt.ids) < 1.6 * words  # env words are mostly single tokens
    assert len(prompt.ids) < policy.max_context - 32
    assert len(tok("<action>", add_special_tokens=False)["input_ids"]) == 1
