"""The offline WebShop-compatible shop: page flow, action validation, score formula, expert, suite."""

from __future__ import annotations

import logging
import pickle
import time
from dataclasses import replace

import pytest

from envs.base import SUCCESS_REWARD, Env, EnvSuite, ExpertEnv, Task, obs_id, tasks_fingerprint
from envs.webshop import WebShopEnv, WebShopEnvFactory
from envs.webshop.catalogue import CATEGORIES, PRODUCT_TYPES
from envs.webshop.reward import fuzzy_match

from .helpers import goto_item, suite

log = logging.getLogger(__name__)


@pytest.fixture()
def env():
    return suite().env_factory()


def _task_with_goal(goal: dict, task_id: str = "crafted") -> Task:
    return Task(task_id=task_id, task_type=goal["category"], payload={"goal": goal})


def _buy(env, goal: dict, options: dict[str, str]):
    """Open the goal's own product, click ``options`` and buy; returns (reward, done, info)."""
    env.reset(_task_with_goal(goal))
    goto_item(env, goal["asin"])
    for value in options.values():
        _, _, _, info = env.step(f"click[{value}]")
        assert info.valid
    _, reward, done, info = env.step("click[buy now]")
    return reward, done, info


def _product(env, asin):
    return env.products[env._asin_to_idx[asin]]


# ------------------------------------------------------------------------------------------------ protocol
def test_env_satisfies_protocols_and_factory_pickles(env):
    assert isinstance(env, Env) and isinstance(env, ExpertEnv)
    factory = pickle.loads(pickle.dumps(suite().env_factory))
    assert factory == suite().env_factory
    clone = factory()
    task = suite().eval_tasks[0]
    assert clone.reset(task) == env.reset(task)


def test_suite_split_and_metadata():
    s = suite()
    assert isinstance(s, EnvSuite) and s.name == "webshop" and s.max_steps == 30
    assert len(s.eval_tasks) == 100 and len(s.train_tasks) == 200
    eval_ids = {t.task_id for t in s.eval_tasks}
    assert not eval_ids & {t.task_id for t in s.train_tasks}
    assert s.eval_fingerprint == tasks_fingerprint(s.eval_tasks)
    assert s.task_types == CATEGORIES and len(CATEGORIES) == 6
    assert {t.task_type for t in s.eval_tasks + s.train_tasks} <= set(CATEGORIES)
    # the held-out set does not depend on how many training goals there are
    bigger = suite(n_train=300)
    assert [t.task_id for t in bigger.eval_tasks] == [t.task_id for t in s.eval_tasks]
    assert [t.payload for t in bigger.train_tasks[:200]] == [t.payload for t in s.train_tasks]


def test_observation_fields(env):
    task = suite().eval_tasks[5]
    obs = env.reset(task)
    goal = task.payload["goal"]
    assert obs.task_description == goal["instruction_text"]
    assert obs.task_type == goal["category"] == task.task_type
    assert obs.text == f"WebShop [SEP] Instruction: [SEP] {goal['instruction_text']} [SEP] Search"
    assert obs.admissible_actions == ("search[<query>]",)


def test_bad_inputs_raise_clear_errors(env):
    with pytest.raises(RuntimeError, match="reset"):
        env.step("search[shoes]")
    with pytest.raises(ValueError, match="payload\\['goal'\\]"):
        env.reset(Task("t", "beauty", payload={}))
    goal = dict(suite().eval_tasks[0].payload["goal"], asin="B0NOTHERE1")
    with pytest.raises(ValueError, match="not in this catalogue"):
        env.reset(_task_with_goal(goal))
    with pytest.raises(ValueError, match="invalid_penalty"):
        WebShopEnvFactory(invalid_penalty=-1)
    with pytest.raises(ValueError, match="results_per_page"):
        WebShopEnvFactory(results_per_page=0)
    with pytest.raises(ValueError, match="reward must be one of"):
        WebShopEnvFactory(reward="dense")


# ------------------------------------------------------------------------------------------------ page flow
def test_results_pagination_item_and_sub_pages(env):
    obs0 = env.reset(suite().eval_tasks[0])
    obs, reward, done, info = env.step("search[running shoes]")
    assert info.valid and reward == 0.0 and not done
    parts = obs.text.split(" [SEP] ")
    assert parts[:4] == ["Instruction:", obs.task_description, "Back to Search", "Page 1 (Total results: 50)"]
    assert parts[4] == "Next >" and "< Prev" not in parts
    assert obs.admissible_actions[:2] == ("click[back to search]", "click[next >]")
    page1_items = [a for a in obs.admissible_actions if a.startswith("click[b0")]
    assert len(page1_items) == 10
    assert all(a.upper()[6:-1] in parts for a in page1_items)  # item ids shown in upper case like WebShop

    obs2, _, _, _ = env.step("click[next >]")
    assert "Page 2 (Total results: 50)" in obs2.text and "click[< prev]" in obs2.admissible_actions
    page2_items = [a for a in obs2.admissible_actions if a.startswith("click[b0")]
    assert len(page2_items) == 10 and not set(page2_items) & set(page1_items)
    for _ in range(3):
        obs_last, _, _, _ = env.step("click[next >]")
    assert (
        "Page 5 (Total results: 50)" in obs_last.text and "click[next >]" not in obs_last.admissible_actions
    )
    for _ in range(4):
        obs_back, _, _, _ = env.step("click[< prev]")
    assert obs_back.text == obs.text

    item_obs, _, _, _ = env.step(page1_items[3])
    product = env.products[env._item]
    assert (
        f"{product['Title']} [SEP] Price: {product['Price']} [SEP] Rating: {product['Rating']}"
        in item_obs.text
    )
    assert item_obs.text.endswith("Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    for name, values in product["options"].items():
        assert " [SEP] ".join([name, *values]) in item_obs.text
        assert all(f"click[{v}]" in item_obs.admissible_actions for v in values)

    desc, _, _, _ = env.step("click[description]")
    assert desc.text.endswith(f"Back to Search [SEP] < Prev [SEP] {product['Description']}")
    assert desc.admissible_actions == ("click[back to search]", "click[< prev]")
    assert env.step("click[< prev]")[0].text == item_obs.text
    feats, _, _, _ = env.step("click[Features]")
    assert feats.text.endswith(" [SEP] ".join(product["BulletPoints"]))
    env.step("click[< prev]")
    reviews, _, _, _ = env.step("click[reviews]")
    for review in product["Reviews"]:
        assert f'"{review["title"]}" [SEP] {review["score"]} [SEP] {review["body"]}' in reviews.text
    env.step("click[< prev]")
    back_to_results, _, _, _ = env.step("click[< prev]")  # item page -> the results page it came from
    assert back_to_results.text == obs.text
    searched_again, _, _, _ = env.step("click[back to search]")
    assert searched_again == obs0


def test_options_are_remembered_until_results_page(env):
    goal = suite().eval_tasks[0].payload["goal"]
    env.reset(_task_with_goal(goal))
    goto_item(env, goal["asin"])
    name, value = next(iter(goal["goal_options"].items()))
    env.step(f"click[{value}]")
    env.step("click[features]")
    env.step("click[< prev]")
    assert env._options == {name: value}
    env.step("click[< prev]")  # back to results resets options, as WebShop's search_results does
    assert env._options == {}


def test_an_option_click_shows_on_the_item_page_and_changes_the_state(env):
    """WebShop's text mode opens the item page with ``You have clicked <value>.``; without it an option click would
    leave the observation (and so the credit estimators' state) unchanged."""
    goal = suite().eval_tasks[0].payload["goal"]
    env.reset(_task_with_goal(goal))
    before = goto_item(env, goal["asin"])
    values = list(_product(env, goal["asin"])["options"].values())
    assert values, "the goal product has options"
    assert "You have clicked" not in before.text
    first, second = values[0][0], values[-1][-1]
    after_one, _, _, _ = env.step(f"click[{first}]")
    assert after_one.text.startswith(f"You have clicked {first}. [SEP] Instruction:")
    assert obs_id(after_one.text) != obs_id(before.text)
    after_two, _, _, _ = env.step(f"click[{second}]")
    clicked = [p for p in after_two.text.split(" [SEP] ") if p.startswith("You have clicked")]
    # two option names: both shown, in the page's option order; one name: the second click replaced the first
    expected = [first, second] if len(values) > 1 else [second]
    assert clicked == [f"You have clicked {v}." for v in expected]
    sub, _, _, _ = env.step("click[features]")
    assert "You have clicked" not in sub.text  # sub-pages show no option labels, as in WebShop
    back, _, _, _ = env.step("click[< prev]")
    assert back.text == after_two.text  # the choice survives a sub-page visit
    results, _, _, _ = env.step("click[< prev]")
    assert "You have clicked" not in results.text


# ------------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    "action",
    [
        "click[buy now]",
        "search[]",
        "search[ ]",
        "search[<query>]",
        "jump",
        "",
        "click[]",
        "click[search]",
        None,
    ],
)
def test_invalid_actions_on_search_page_cost_penalty_and_keep_page(env, action):
    obs = env.reset(suite().eval_tasks[0])
    new_obs, reward, done, info = env.step(action)
    assert reward == pytest.approx(-0.1) and not info.valid and not done and not info.won
    assert new_obs == obs


def test_invalid_actions_on_results_page(env):
    env.reset(suite().eval_tasks[0])
    obs, _, _, _ = env.step("search[coffee table]")
    for action in [
        "search[chair]",
        "click[< prev]",
        "click[buy now]",
        "click[b0zzzzzzzz]",
        "click[description]",
    ]:
        new_obs, reward, _, info = env.step(action)
        assert (reward, info.valid, new_obs) == (-0.1, False, obs), action


def test_case_and_whitespace_are_normalised(env):
    env.reset(suite().eval_tasks[0])
    obs, _, _, info = env.step("  SEARCH[  Running    Shoes ]")
    assert info.valid and "Page 1" in obs.text
    assert env._keywords == ["running", "shoes"]
    obs, _, _, info = env.step("Click[ NEXT  > ]")
    assert info.valid and "Page 2" in obs.text


def test_episode_truncates_at_max_steps():
    env = WebShopEnv(replace(suite().env_factory, max_steps=4))
    env.reset(suite().eval_tasks[0])
    results = [env.step("click[nothing]") for _ in range(4)]
    assert [done for _, _, done, _ in results] == [False, False, False, True]
    assert results[-1][3].extra == {"task_score": 0.0, "page": "search", "truncated": True}
    with pytest.raises(RuntimeError, match="ended"):
        env.step("search[shoes]")


# ------------------------------------------------------------------------------------------------ score
def test_correct_purchase_wins(env):
    goal = suite().eval_tasks[0].payload["goal"]
    reward, done, info = _buy(env, goal, goal["goal_options"])
    assert (reward, done, info.won, info.extra["task_score"]) == (SUCCESS_REWARD, True, True, 1.0)
    assert info.extra["purchase"]["asin"] == goal["asin"]


def _goal_with_options(env) -> dict:
    for task in suite().eval_tasks:
        goal = task.payload["goal"]
        product = _product(env, goal["asin"])
        if goal["goal_options"] and all(len(product["options"][n]) >= 2 for n in goal["goal_options"]):
            return goal
    raise AssertionError("no goal with options")


def test_wrong_option_costs_one_option_match(env):
    goal = _goal_with_options(env)
    n_att, n_opt = len(goal["attributes"]), len(goal["goal_options"])
    name = sorted(goal["goal_options"])[0]
    wrong = next(v for v in _product(env, goal["asin"])["options"][name] if v != goal["goal_options"][name])
    reward, done, info = _buy(env, goal, {**goal["goal_options"], name: wrong})
    expected = (n_att + (n_opt - 1) + 1) / (n_att + n_opt + 1)  # r_type 1, all attributes, price within bound
    assert info.extra["task_score"] == pytest.approx(expected)
    assert (reward, done, info.won) == (0.0, True, False)
    # not choosing an option at all scores the same as choosing a wrong one
    _, _, info = _buy(env, goal, {k: v for k, v in goal["goal_options"].items() if k != name})
    assert info.extra["task_score"] == pytest.approx(expected)


def test_score_reward_pays_the_purchase_score_and_success_stays_score_one(env):
    """reward="score": 10 x the score on the buying step (near miss > 0), success still only at 1.0."""
    score_env = replace(env.config, reward="score")()
    goal = _goal_with_options(env)
    name = sorted(goal["goal_options"])[0]
    wrong = next(v for v in _product(env, goal["asin"])["options"][name] if v != goal["goal_options"][name])
    reward, done, info = _buy(score_env, goal, {**goal["goal_options"], name: wrong})
    assert 0.0 < info.extra["task_score"] < 1.0 and not info.won and done
    assert reward == pytest.approx(SUCCESS_REWARD * info.extra["task_score"])
    paper_reward, _, paper_info = _buy(env, goal, {**goal["goal_options"], name: wrong})
    assert paper_reward == 0.0 and paper_info.extra["task_score"] == info.extra["task_score"]
    reward, _, info = _buy(score_env, goal, goal["goal_options"])
    assert (reward, info.won) == (SUCCESS_REWARD, True)
    # steps before the purchase pay nothing; an invalid action still costs the penalty
    score_env.reset(_task_with_goal(goal))
    _, reward, _, info = score_env.step("click[nothing here]")
    assert (reward, info.valid) == (-score_env.config.invalid_penalty, False)
    _, reward, _, info = score_env.step(f"search[{goal['query']}]")
    assert (reward, info.valid) == (0.0, True)


def test_missing_attribute_costs_one_attribute_match(env):
    goal = suite().eval_tasks[1].payload["goal"]
    product = _product(env, goal["asin"])
    ptype = next(t for t in PRODUCT_TYPES if t.query == goal["query"])
    text = " ".join([product["Title"], *product["BulletPoints"], product["Description"]]).lower()
    missing = next(
        a
        for a in ptype.attributes
        if a not in text and not any(fuzzy_match(p, a) for p in product["Attributes"])
    )
    crafted = dict(goal, attributes=[*goal["attributes"], missing])
    n_att, n_opt = len(crafted["attributes"]), len(goal["goal_options"])
    reward, _, info = _buy(env, crafted, goal["goal_options"])
    assert info.extra["task_score"] == pytest.approx(((n_att - 1) + n_opt + 1) / (n_att + n_opt + 1))
    assert info.extra["purchase"]["num_attr_matches"] == n_att - 1 and reward == 0.0


def test_over_budget_costs_the_price_term(env):
    goal = suite().eval_tasks[2].payload["goal"]
    price = _product(env, goal["asin"])["pricing"][0]
    crafted = dict(goal, price_upper=price - 0.01)
    n_att, n_opt = len(goal["attributes"]), len(goal["goal_options"])
    reward, _, info = _buy(env, crafted, goal["goal_options"])
    assert info.extra["task_score"] == pytest.approx((n_att + n_opt + 0) / (n_att + n_opt + 1))
    assert info.extra["purchase"]["r_price"] is False and reward == 0.0


def test_all_three_mistakes_add_up(env):
    goal = _goal_with_options(env)
    product = _product(env, goal["asin"])
    name = sorted(goal["goal_options"])[0]
    wrong = next(v for v in product["options"][name] if v != goal["goal_options"][name])
    crafted = dict(goal, price_upper=product["pricing"][0] / 2)
    n_att, n_opt = len(goal["attributes"]), len(goal["goal_options"])
    _, _, info = _buy(env, crafted, {**goal["goal_options"], name: wrong})
    assert info.extra["task_score"] == pytest.approx((n_att + n_opt - 1) / (n_att + n_opt + 1))


# ------------------------------------------------------------------------------------------------ expert
def test_expert_reaches_full_score_on_most_goals(env):
    tasks = suite().eval_tasks + suite().train_tasks[:100]
    scores, steps, invalid = [], 0, 0
    start = time.perf_counter()
    for task in tasks:
        env.reset(task)
        done = False
        while not done:
            obs, reward, done, info = env.step(env.expert_action())
            steps += 1
            invalid += not info.valid
        scores.append(info.extra["task_score"])
        assert (reward == SUCCESS_REWARD) == (info.extra["task_score"] == 1.0) == info.won
    elapsed = time.perf_counter() - start
    fraction = sum(s == 1.0 for s in scores) / len(scores)
    log.info("expert: %.3f of %d goals at score 1.0, %.0f steps/s", fraction, len(scores), steps / elapsed)
    assert invalid == 0
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert fraction >= 0.8
    assert env.expert_action() is None


def test_search_without_hits_shows_empty_results(env):
    env.reset(suite().eval_tasks[0])
    obs, reward, _, info = env.step("search[qwertyuiop]")
    assert info.valid and reward == 0.0
    assert obs.text.endswith("Back to Search [SEP] Page 1 (Total results: 0)")
    assert obs.admissible_actions == ("click[back to search]",)
