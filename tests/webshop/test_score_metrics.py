"""WebShop's purchase score reaches the metrics (``val/score``), the start-vs-end table and the episodes."""

from __future__ import annotations

from envs.base import Task
from progpo.summary import summary_table
from progpo.types import Episode, episode_metrics


def _episode(i: int, won: bool, score: float | None) -> Episode:
    return Episode(traj=i, group=0, task=Task(task_id=str(i), task_type="food", payload={}), won=won, length=5,
                   n_invalid=0, score=score)


def test_score_is_the_mean_over_episodes_that_report_one_and_absent_otherwise():
    metrics = episode_metrics([_episode(0, True, 1.0), _episode(1, False, 0.5), _episode(2, False, 0.0)], "val")
    assert metrics["val/score"] == 0.5 and metrics["val/success"] == 1 / 3
    assert "val/score" not in episode_metrics([_episode(0, True, None)], "val")  # ALFWorld: no score


def test_summary_table_has_a_score_row():
    table = summary_table({"val/success": 0.1, "val/score": 0.27}, {"val/success": 0.2, "val/score": 0.4}, ["food"])
    assert "| score (0-1) | 0.27 | 0.4 | +0.130 |" in table
    assert "score" not in summary_table({"val/success": 0.1}, {"val/success": 0.2}, [])


def test_collected_episodes_carry_the_shops_score():
    from envs.base import Observation, StepInfo
    from progpo.rollout.collector import _Playing
    from progpo.rollout.engines.base import Generation
    from progpo.rollout.prompt import Prompt

    obs = Observation(text="x", admissible_actions=("click[buy now]",), task_description="t", task_type="food")
    state = _Playing([Task(task_id="a", task_type="food", payload={})], [obs], group_size=1)
    gen = Generation(response_ids=[[1]], texts=["<action>click[buy now]</action>"], logprobs=[[-0.1]],
                     allowed_token_ids=[None])
    result = (obs, 0.0, True, StepInfo(won=False, valid=True, extra={"task_score": 0.75}))
    state.record(0, Prompt("p", [1, 2], 0, False), gen, 0, "click[buy now]", result, max_steps=5)
    assert state.episodes()[0].score == 0.75


def test_env_metrics_are_means_over_the_episodes_that_report_them():
    eps = [_episode(i, False, 0.5) for i in range(3)]
    eps[0].env_metrics = {"option_match": 1.0, "type_match": 1.0}
    eps[1].env_metrics = {"option_match": 0.0, "type_match": 0.5}
    eps[2].env_metrics = {"type_match": 0.0}  # a goal without options reports no option_match
    metrics = episode_metrics(eps, "val")
    assert metrics["val/option_match"] == 0.5 and metrics["val/type_match"] == 0.5
    assert not any(k.endswith("_match") for k in episode_metrics([_episode(0, True, None)], "val"))


def test_a_purchase_reports_its_parts_and_they_reach_the_episode():
    """The shop's purchase parts (WebShop's verbose reward) reach ``Episode.env_metrics`` through the collector."""
    from progpo.rollout.collector import _Playing
    from progpo.rollout.engines.base import Generation
    from progpo.rollout.prompt import Prompt

    from .helpers import goto_item, suite

    shop = suite()
    env = shop.env_factory()
    task = next(t for t in shop.train_tasks if t.payload["goal"]["goal_options"])
    goal = task.payload["goal"]
    first = env.reset(task)
    goto_item(env, goal["asin"])  # the right product, no option clicked: options miss, the rest matches
    result = env.step("click[buy now]")
    parts = result[3].extra["episode_metrics"]
    assert parts["option_match"] == 0.0 and parts["type_match"] == 1.0 and parts["attribute_match"] == 1.0
    assert result[3].extra["purchase"]["r_option"] == parts["option_match"]
    state = _Playing([task], [first], group_size=1)
    gen = Generation(response_ids=[[1]], texts=["<action>click[buy now]</action>"], logprobs=[[-0.1]],
                     allowed_token_ids=[None])
    state.record(0, Prompt("p", [1, 2], 0, False), gen, 0, "click[buy now]", result, max_steps=5)
    assert state.episodes()[0].env_metrics == parts
