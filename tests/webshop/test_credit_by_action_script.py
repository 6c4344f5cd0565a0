"""``scripts/webshop_credit_by_action.py``: every step sorted by its command, "Buy Now" by whether the goal's
options were set before it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("webshop_credit_by_action", ROOT / "scripts/webshop_credit_by_action.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _turn(traj: int, t: int, action: str, group: int = 0) -> SimpleNamespace:
    return SimpleNamespace(traj=traj, group=group, t=t, action=action)


def test_step_kinds_sorts_commands_and_splits_buy_now_by_the_options_clicked_before_it_in_its_trajectory():
    script = _script()
    turns = [  # two trajectories, interleaved and out of step order, as a batch may hold them
        _turn(1, 2, "click[Buy Now]"),
        _turn(0, 0, "search[grey jeans]"),
        _turn(1, 0, "click[B0ABCDEFGH]"),
        _turn(0, 1, "click[b0abcdefgh]"),
        _turn(0, 2, "click[grey]"),
        _turn(1, 1, "click[blue]"),
        _turn(0, 3, "click[M]"),
        _turn(0, 4, "click[Buy Now]"),
        _turn(2, 0, "click[grey]", group=1),
        _turn(2, 1, "click[buy now]", group=1),  # group 1's goal names no options: always "set"
        _turn(3, 0, "click[Next >]"),
        _turn(3, 1, "click[Buy Now]"),  # clicks in another trajectory do not count
    ]
    kinds = script.step_kinds(turns, {0: {"grey", "m"}, 1: set()})
    assert kinds == [
        "buy now, options not set", "search", "product", "product", "option right", "option wrong",
        "option right", "buy now, options set", "option wrong", "buy now, options set", "next >",
        "buy now, options not set",
    ]


def test_step_kinds_needs_every_option_of_the_goal_not_just_as_many_clicks():
    script = _script()
    turns = [_turn(0, 0, "click[grey]"), _turn(0, 1, "click[grey]"), _turn(0, 2, "click[Buy Now]")]
    assert script.step_kinds(turns, {0: {"grey", "m"}})[-1] == "buy now, options not set"
