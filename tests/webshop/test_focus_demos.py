"""``warm_start.focus_episodes``: clean expert episodes labelled only on the pages ``focus_pages`` names."""

from __future__ import annotations

import pytest

from envs.webshop.shop import WebShopEnv
from progpo.config.groups import WarmStartConfig
from progpo.warmstart.demos import collect_focus_demos
from progpo.warmstart.tiny import _warm_start_key

from .helpers import suite


def _expert_item_page_steps(shop, tasks):
    """The definition, as a plain loop: every state of the expert's own path that is on an item page."""
    env = shop.env_factory()
    steps = []
    for task in tasks:
        obs = env.reset(task)
        for _ in range(shop.max_steps):
            action = env.expert_action()
            if action is None:
                break
            if env.page_kind == "item":
                steps.append((obs.task_description, obs.text, action))
            obs, _, done, _ = env.step(action)
            if done:
                break
    return steps


def test_focus_demos_label_only_item_pages_of_clean_expert_episodes_on_the_tasks_after_n_episodes():
    shop = suite()
    cfg = WarmStartConfig(n_episodes=5, focus_episodes=6, focus_pages=("item",), action_noise=0.15, seed=3)
    demos, stats = collect_focus_demos(shop, cfg)
    expected = _expert_item_page_steps(shop, shop.train_tasks[5:11])
    assert [(d.task_description, d.observation, d.expert_action) for d in demos] == expected  # noise ignored
    assert stats.episodes == 6 and stats.noisy_steps == 0 and stats.invalid_steps == 0
    assert {d.episode for d in demos} <= set(range(5, 11))
    labels = {d.expert_action for d in demos}
    assert "click[buy now]" in labels and any(a not in ("click[buy now]", "click[< prev]") for a in labels)
    assert stats.won >= 4  # the expert's own path buys the right product with the right options
    for d in demos:  # the history is the expert's path up to the item page
        assert d.past and d.past[0][1].startswith("search[")


def test_option_labels_are_the_goal_options_the_instruction_names():
    shop = suite()
    demos, _ = collect_focus_demos(shop, WarmStartConfig(n_episodes=0, focus_episodes=20, focus_pages=("item",)))
    options = [d for d in demos if d.expert_action not in ("click[buy now]", "click[< prev]")]
    assert len(options) >= 10
    named = sum(d.expert_action[len("click[") : -1] in d.task_description for d in options)
    assert named >= 0.8 * len(options)  # mostly the option the instruction names (a few match the product text)


def test_zero_focus_episodes_collect_nothing_and_the_first_stage_key_ignores_the_focus_stage():
    demos, stats = collect_focus_demos(suite(), WarmStartConfig(n_episodes=4))
    assert demos == [] and stats.episodes == 0
    plain = _warm_start_key(WarmStartConfig(n_episodes=4, precision="bf16-mixed"))
    assert not {"precision", "focus_episodes", "focus_pages"} & set(plain)  # builds cached before stay valid
    focused = _warm_start_key(WarmStartConfig(n_episodes=4, focus_episodes=2, focus_pages=["item"], focus_lr=1e-4))
    assert focused == plain  # the focus stage starts from the same (cached) first stage


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"focus_episodes": -1, "focus_pages": ("item",)}, "focus_episodes"), ({"focus_episodes": 3}, "focus_pages"),
     ({"focus_epochs": -1}, "focus_epochs"), ({"focus_lr": 0.0}, "focus_lr"),
     ({"focus_replay_episodes": -2}, "focus_replay_episodes")],
)
def test_bad_focus_settings_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"warm_start\.{field}"):
        WarmStartConfig(**kwargs)


def test_focus_demos_need_an_env_that_reports_its_page():
    from tests.models.toy_env import fake_room_suite

    with pytest.raises(TypeError, match="page_kind.*focus_episodes=0"):
        collect_focus_demos(fake_room_suite(), WarmStartConfig(focus_episodes=1, focus_pages=("room",)))


def test_page_kind_follows_the_shops_pages():
    shop = suite()
    env: WebShopEnv = shop.env_factory()
    env.reset(shop.train_tasks[0])
    kinds = [env.page_kind]
    while True:
        action = env.expert_action()
        if action is None:
            break
        env.step(action)
        kinds.append(env.page_kind)
    assert kinds[0] == "search" and kinds[1] == "results" and "item" in kinds and kinds[-1] == "done"
    env.reset(shop.train_tasks[0])
    env.step(env.expert_action())
    product = next(c for c in env.get_available_actions()["clickables"] if c.startswith("b0"))
    walk = [f"click[{product}]", "click[description]", "click[< prev]", "click[< prev]", "click[back to search]"]
    assert [env.step(a)[3].valid and env.page_kind for a in walk] == ["item", "sub", "item", "results", "search"]
