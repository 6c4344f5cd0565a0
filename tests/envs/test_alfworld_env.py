"""The ALFWorld adapter on the real TextWorld engine: observations, rewards, invalid actions, official layout."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from envs.alfworld import AlfWorldEnv, AlfWorldEnvFactory, find_games, make_suite
from envs.alfworld import engine as alfworld_engine
from envs.alfworld.env import BANNER, NOTHING_HAPPENS
from envs.alfworld.generate import TASK_TYPES
from envs.base import SUCCESS_REWARD, EnvSuite, Task, obs_id, tasks_fingerprint

REPO = Path(__file__).resolve().parents[2]

# A kitchen written by hand in the style of the official json_2.1.1 problems (every ALFRED type declared, the
# sink basin as a part of the sink, no action costs): not produced by envs.alfworld.generate.
HAND_WRITTEN_PROBLEM = """
(define (problem plan_trial_T20190908_000000_000001)
(:domain alfred)
(:objects
        agent1 - agent
        AppleType - otype
        ButterKnifeType - otype
        EggType - otype
        KnifeType - otype
        MugType - otype
        PlateType - otype
        SaltShakerType - otype
        CabinetType - rtype
        CounterTopType - rtype
        DiningTableType - rtype
        FridgeType - rtype
        GarbageCanType - rtype
        MicrowaveType - rtype
        SinkBasinType - rtype
        Apple_bar__minus_01_dot_65_bar__plus_00_dot_81_bar__plus_00_dot_07 - object
        Egg_bar__minus_02_dot_04_bar__plus_00_dot_81_bar__plus_01_dot_24 - object
        Knife_bar__minus_01_dot_70_bar__plus_00_dot_79_bar__minus_00_dot_22 - object
        Mug_bar__minus_00_dot_27_bar__plus_00_dot_91_bar__minus_01_dot_33 - object
        Plate_bar__plus_00_dot_91_bar__plus_00_dot_70_bar__minus_01_dot_46 - object
        SaltShaker_bar__plus_01_dot_03_bar__plus_00_dot_91_bar__minus_01_dot_21 - object
        Cabinet_bar__minus_00_dot_33_bar__plus_01_dot_89_bar__minus_02_dot_51 - receptacle
        Cabinet_bar__plus_00_dot_95_bar__plus_00_dot_39_bar__minus_01_dot_46 - receptacle
        CounterTop_bar__minus_00_dot_67_bar__plus_00_dot_95_bar__plus_01_dot_92 - receptacle
        DiningTable_bar__minus_01_dot_75_bar__plus_00_dot_01_bar__minus_00_dot_07 - receptacle
        Fridge_bar__minus_02_dot_10_bar__plus_00_dot_00_bar__plus_01_dot_07 - receptacle
        GarbageCan_bar__minus_01_dot_94_bar_00_dot_00_bar__plus_02_dot_03 - receptacle
        Microwave_bar__minus_00_dot_24_bar__plus_01_dot_69_bar__minus_02_dot_53 - receptacle
        Sink_bar__minus_00_dot_11_bar__plus_00_dot_89_bar__minus_02_dot_01_bar_SinkBasin - receptacle
        loc_bar__minus_1_bar__minus_7_bar_2_bar_45 - location
        loc_bar__minus_2_bar_3_bar_3_bar_45 - location
        loc_bar__minus_1_bar__minus_8_bar_2_bar__minus_30 - location
        loc_bar_3_bar__minus_5_bar_2_bar_45 - location
        loc_bar__minus_4_bar_7_bar_0_bar_30 - location
        loc_bar__minus_3_bar_1_bar_3_bar_45 - location
        loc_bar__minus_4_bar_4_bar_3_bar_60 - location
        loc_bar__minus_5_bar_8_bar_3_bar_60 - location
        loc_bar_0_bar_0_bar_0_bar_30 - location
        )


(:init


        (receptacleType Cabinet_bar__minus_00_dot_33_bar__plus_01_dot_89_bar__minus_02_dot_51 CabinetType)
        (receptacleType Cabinet_bar__plus_00_dot_95_bar__plus_00_dot_39_bar__minus_01_dot_46 CabinetType)
        (receptacleType CounterTop_bar__minus_00_dot_67_bar__plus_00_dot_95_bar__plus_01_dot_92 CounterTopType)
        (receptacleType DiningTable_bar__minus_01_dot_75_bar__plus_00_dot_01_bar__minus_00_dot_07 DiningTableType)
        (receptacleType Fridge_bar__minus_02_dot_10_bar__plus_00_dot_00_bar__plus_01_dot_07 FridgeType)
        (receptacleType GarbageCan_bar__minus_01_dot_94_bar_00_dot_00_bar__plus_02_dot_03 GarbageCanType)
        (receptacleType Microwave_bar__minus_00_dot_24_bar__plus_01_dot_69_bar__minus_02_dot_53 MicrowaveType)
        (receptacleType Sink_bar__minus_00_dot_11_bar__plus_00_dot_89_bar__minus_02_dot_01_bar_SinkBasin SinkBasinType)
        (objectType Apple_bar__minus_01_dot_65_bar__plus_00_dot_81_bar__plus_00_dot_07 AppleType)
        (objectType Egg_bar__minus_02_dot_04_bar__plus_00_dot_81_bar__plus_01_dot_24 EggType)
        (objectType Knife_bar__minus_01_dot_70_bar__plus_00_dot_79_bar__minus_00_dot_22 KnifeType)
        (objectType Mug_bar__minus_00_dot_27_bar__plus_00_dot_91_bar__minus_01_dot_33 MugType)
        (objectType Plate_bar__plus_00_dot_91_bar__plus_00_dot_70_bar__minus_01_dot_46 PlateType)
        (objectType SaltShaker_bar__plus_01_dot_03_bar__plus_00_dot_91_bar__minus_01_dot_21 SaltShakerType)
        (canContain CabinetType MugType)
        (canContain CabinetType PlateType)
        (canContain CabinetType SaltShakerType)
        (canContain CounterTopType AppleType)
        (canContain CounterTopType EggType)
        (canContain CounterTopType KnifeType)
        (canContain CounterTopType MugType)
        (canContain CounterTopType PlateType)
        (canContain CounterTopType SaltShakerType)
        (canContain DiningTableType AppleType)
        (canContain DiningTableType EggType)
        (canContain DiningTableType KnifeType)
        (canContain DiningTableType MugType)
        (canContain DiningTableType PlateType)
        (canContain FridgeType AppleType)
        (canContain FridgeType EggType)
        (canContain FridgeType PlateType)
        (canContain GarbageCanType AppleType)
        (canContain GarbageCanType EggType)
        (canContain MicrowaveType AppleType)
        (canContain MicrowaveType EggType)
        (canContain MicrowaveType MugType)
        (canContain SinkBasinType EggType)
        (canContain SinkBasinType MugType)
        (pickupable Apple_bar__minus_01_dot_65_bar__plus_00_dot_81_bar__plus_00_dot_07)
        (pickupable Egg_bar__minus_02_dot_04_bar__plus_00_dot_81_bar__plus_01_dot_24)
        (pickupable Knife_bar__minus_01_dot_70_bar__plus_00_dot_79_bar__minus_00_dot_22)
        (pickupable Mug_bar__minus_00_dot_27_bar__plus_00_dot_91_bar__minus_01_dot_33)
        (pickupable Plate_bar__plus_00_dot_91_bar__plus_00_dot_70_bar__minus_01_dot_46)
        (pickupable SaltShaker_bar__plus_01_dot_03_bar__plus_00_dot_91_bar__minus_01_dot_21)
        (isReceptacleObject Mug_bar__minus_00_dot_27_bar__plus_00_dot_91_bar__minus_01_dot_33)
        (isReceptacleObject Plate_bar__plus_00_dot_91_bar__plus_00_dot_70_bar__minus_01_dot_46)
        (openable Cabinet_bar__minus_00_dot_33_bar__plus_01_dot_89_bar__minus_02_dot_51)
        (openable Cabinet_bar__plus_00_dot_95_bar__plus_00_dot_39_bar__minus_01_dot_46)
        (openable Fridge_bar__minus_02_dot_10_bar__plus_00_dot_00_bar__plus_01_dot_07)
        (openable Microwave_bar__minus_00_dot_24_bar__plus_01_dot_69_bar__minus_02_dot_53)
        (atLocation agent1 loc_bar_0_bar_0_bar_0_bar_30)
        (heatable Apple_bar__minus_01_dot_65_bar__plus_00_dot_81_bar__plus_00_dot_07)
        (heatable Egg_bar__minus_02_dot_04_bar__plus_00_dot_81_bar__plus_01_dot_24)
        (heatable Mug_bar__minus_00_dot_27_bar__plus_00_dot_91_bar__minus_01_dot_33)
        (coolable Egg_bar__minus_02_dot_04_bar__plus_00_dot_81_bar__plus_01_dot_24)
        (cleanable Egg_bar__minus_02_dot_04_bar__plus_00_dot_81_bar__plus_01_dot_24)
        (inReceptacle Egg_bar__minus_02_dot_04_bar__plus_00_dot_81_bar__plus_01_dot_24 Fridge_bar__minus_02_dot_10_bar__plus_00_dot_00_bar__plus_01_dot_07)
        (inReceptacle Apple_bar__minus_01_dot_65_bar__plus_00_dot_81_bar__plus_00_dot_07 CounterTop_bar__minus_00_dot_67_bar__plus_00_dot_95_bar__plus_01_dot_92)
        (inReceptacle Knife_bar__minus_01_dot_70_bar__plus_00_dot_79_bar__minus_00_dot_22 CounterTop_bar__minus_00_dot_67_bar__plus_00_dot_95_bar__plus_01_dot_92)
        (inReceptacle Mug_bar__minus_00_dot_27_bar__plus_00_dot_91_bar__minus_01_dot_33 Cabinet_bar__minus_00_dot_33_bar__plus_01_dot_89_bar__minus_02_dot_51)
        (inReceptacle Plate_bar__plus_00_dot_91_bar__plus_00_dot_70_bar__minus_01_dot_46 Cabinet_bar__plus_00_dot_95_bar__plus_00_dot_39_bar__minus_01_dot_46)
        (inReceptacle SaltShaker_bar__plus_01_dot_03_bar__plus_00_dot_91_bar__minus_01_dot_21 DiningTable_bar__minus_01_dot_75_bar__plus_00_dot_01_bar__minus_00_dot_07)
        (receptacleAtLocation Cabinet_bar__minus_00_dot_33_bar__plus_01_dot_89_bar__minus_02_dot_51 loc_bar__minus_1_bar__minus_7_bar_2_bar_45)
        (receptacleAtLocation Cabinet_bar__plus_00_dot_95_bar__plus_00_dot_39_bar__minus_01_dot_46 loc_bar_3_bar__minus_5_bar_2_bar_45)
        (receptacleAtLocation CounterTop_bar__minus_00_dot_67_bar__plus_00_dot_95_bar__plus_01_dot_92 loc_bar__minus_2_bar_3_bar_3_bar_45)
        (receptacleAtLocation DiningTable_bar__minus_01_dot_75_bar__plus_00_dot_01_bar__minus_00_dot_07 loc_bar__minus_3_bar_1_bar_3_bar_45)
        (receptacleAtLocation Fridge_bar__minus_02_dot_10_bar__plus_00_dot_00_bar__plus_01_dot_07 loc_bar__minus_4_bar_4_bar_3_bar_60)
        (receptacleAtLocation GarbageCan_bar__minus_01_dot_94_bar_00_dot_00_bar__plus_02_dot_03 loc_bar__minus_5_bar_8_bar_3_bar_60)
        (receptacleAtLocation Microwave_bar__minus_00_dot_24_bar__plus_01_dot_69_bar__minus_02_dot_53 loc_bar__minus_1_bar__minus_8_bar_2_bar__minus_30)
        (receptacleAtLocation Sink_bar__minus_00_dot_11_bar__plus_00_dot_89_bar__minus_02_dot_01_bar_SinkBasin loc_bar__minus_4_bar_7_bar_0_bar_30)
        (objectAtLocation Egg_bar__minus_02_dot_04_bar__plus_00_dot_81_bar__plus_01_dot_24 loc_bar__minus_4_bar_4_bar_3_bar_60)
        (objectAtLocation Apple_bar__minus_01_dot_65_bar__plus_00_dot_81_bar__plus_00_dot_07 loc_bar__minus_2_bar_3_bar_3_bar_45)
        (objectAtLocation Knife_bar__minus_01_dot_70_bar__plus_00_dot_79_bar__minus_00_dot_22 loc_bar__minus_2_bar_3_bar_3_bar_45)
        (objectAtLocation Mug_bar__minus_00_dot_27_bar__plus_00_dot_91_bar__minus_01_dot_33 loc_bar__minus_1_bar__minus_7_bar_2_bar_45)
        (objectAtLocation Plate_bar__plus_00_dot_91_bar__plus_00_dot_70_bar__minus_01_dot_46 loc_bar_3_bar__minus_5_bar_2_bar_45)
        (objectAtLocation SaltShaker_bar__plus_01_dot_03_bar__plus_00_dot_91_bar__minus_01_dot_21 loc_bar__minus_3_bar_1_bar_3_bar_45)
        )


(:goal
    (and
        (exists (?r - receptacle)
            (exists (?o - object)
                (and
                    (heatable ?o)
                    (objectType ?o EggType)
                    (receptacleType ?r DiningTableType)
                    (isHot ?o)
                    (inReceptacle ?o ?r)
                )
            )
        )
    )
)
)
"""
HAND_WRITTEN_GOAL = "heat some egg and put it in diningtable"


def _write_official_game(folder: Path, task_type: str, solvable: bool = True) -> None:
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    folder.mkdir(parents=True)
    traj = {
        "task_type": task_type,
        "pddl_params": {
            "object_target": "Egg",
            "parent_target": "DiningTable",
            "toggle_target": "",
            "mrecep_target": "",
            "object_sliced": False,
        },
    }
    (folder / "traj_data.json").write_text(json.dumps(traj))
    game = {
        "pddl_domain": Path(ALFRED_PDDL_PATH).read_text(),
        "grammar": Path(ALFRED_TWL2_PATH).read_text().replace("UNKNOWN GOAL", HAND_WRITTEN_GOAL),
        "pddl_problem": HAND_WRITTEN_PROBLEM,
        "walkthrough": None,
        "solvable": solvable,
    }
    (folder / "game.tw-pddl").write_text(json.dumps(game))


@pytest.fixture
def official_root(tmp_path):
    """ALFWorld's release layout: json_2.1.1/{train,valid_unseen}/<task>/<trial>/, with games to be skipped."""
    root = tmp_path / "alfworld_data"
    train = root / "json_2.1.1" / "train"
    heat = "pick_heat_then_place_in_recep"
    _write_official_game(train / f"{heat}-Egg-None-DiningTable-12" / "trial_T20190908_000000_000001", heat)
    _write_official_game(train / f"{heat}-Egg-None-DiningTable-12" / "trial_T20190908_000000_000002", heat)
    _write_official_game(
        train / f"{heat}-EggSliced-None-DiningTable-12" / "trial_T20190908_000000_000003", heat
    )
    _write_official_game(
        train / "pick_and_place_with_movable_recep-Egg-Plate-DiningTable-12" / "trial_T1",
        "pick_and_place_simple",
    )
    _write_official_game(
        train / f"{heat}-Egg-None-DiningTable-13" / "trial_T20190908_000000_000004", heat, False
    )
    valid = root / "json_2.1.1" / "valid_unseen"
    _write_official_game(valid / f"{heat}-Egg-None-DiningTable-10" / "trial_T20190909_000000_000001", heat)
    return root


def _play_expert(env: AlfWorldEnv, task: Task, limit: int = 30) -> tuple[bool, int, float]:
    env.reset(task)
    total, done, info = 0.0, False, None
    while not done and env.steps < limit:
        action = env.expert_action()
        assert action is not None, f"expert gave up in {task.task_id} after {env.steps} steps"
        _obs, reward, done, info = env.step(action)
        total += reward
    return bool(info and info.won), env.steps, total


def test_reset_observation_matches_alfworld(alfworld_root):
    task = find_games(alfworld_root, "train", TASK_TYPES)[0]
    env = AlfWorldEnv()
    obs = env.reset(task)
    traj = json.loads((Path(task.payload["game_file"]).parent / "traj_data.json").read_text())
    assert BANNER not in obs.text and "Your task is to" not in obs.text
    assert obs.text.startswith("You are in the middle of a room. Looking quickly around you, you see ")
    assert obs.task_description == traj["turk_annotations"]["anns"][0]["task_desc"] + "."
    assert obs.task_type == task.task_type == traj["task_type"]
    assert list(obs.admissible_actions) == sorted(obs.admissible_actions)
    assert {"look", "inventory", "help"} <= set(obs.admissible_actions)
    assert all(
        a.startswith("go to ") for a in obs.admissible_actions if a not in ("look", "inventory", "help")
    )
    look, reward, done, info = env.step("look")
    assert (reward, done, info.valid) == (0.0, False, True)
    assert look.text.startswith("You are in the middle of a room.")
    env.close()


def test_invalid_action_stay_is_penalised_and_leaves_the_engine_alone(alfworld_root):
    task = find_games(alfworld_root, "train", ("pick_heat_then_place_in_recep",))[0]
    env = AlfWorldEnv(max_steps=50, invalid_penalty=0.25, invalid_action="stay")
    obs = env.reset(task)
    plan_head = env.expert_action()
    bad, reward, done, info = env.step("fly to the moon")
    assert (bad.text, reward, done, info.valid, info.won) == (NOTHING_HAPPENS, -0.25, False, False, False)
    assert bad.admissible_actions == obs.admissible_actions and env.steps == 1
    assert env.expert_action() == plan_head  # the state did not move
    # Case and whitespace do not make a command invalid.
    moved, reward, _, info = env.step("  " + plan_head.upper().replace(" ", "   ") + " ")
    assert info.valid and reward == 0.0 and moved.text.startswith("You arrive at")
    won, steps, total = _play_expert(env, task)
    assert won and total == SUCCESS_REWARD


def test_invalid_action_pass_goes_to_the_engine(alfworld_root):
    task = find_games(alfworld_root, "train", ("pick_and_place_simple",))[0]
    env = AlfWorldEnv(invalid_action="pass", invalid_penalty=0.1)
    obs = env.reset(task)
    bad, reward, done, info = env.step("take the moon from the sky")
    assert (reward, done, info.valid) == (pytest.approx(-0.1), False, False)
    assert bad.text == NOTHING_HAPPENS  # the engine's own answer to an unknown command
    assert bad.admissible_actions == obs.admissible_actions
    with pytest.raises(ValueError, match="env.invalid_action"):
        AlfWorldEnv(invalid_action="ignore")


def test_episode_ends_at_max_steps_and_refuses_more(alfworld_root):
    task = find_games(alfworld_root, "train", ("pick_two_obj_and_place",))[0]
    env = AlfWorldEnv(max_steps=3)
    env.reset(task)
    results = [env.step("look") for _ in range(3)]
    assert [r[2] for r in results] == [False, False, True]
    assert not results[-1][3].won and results[-1][1] == 0.0
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("look")
    assert env.expert_action() is None
    env.reset(task)  # a finished env plays again after reset
    assert env.steps == 0


def test_reset_keeps_the_command_line(alfworld_root):
    """fast-downward's translator overwrites sys.argv; Hydra/pytest processes must not see that."""
    argv = list(sys.argv)
    env = AlfWorldEnv()
    for task in find_games(alfworld_root, "valid", TASK_TYPES)[:2]:
        env.reset(task)
    assert sys.argv == argv


def test_official_layout_with_hand_written_game(official_root):
    suite = make_suite(source="official", data_dir=str(official_root), n_train=0, n_eval=0)
    ids = [t.task_id for t in suite.train_tasks]
    # Sliced, movable and unsolvable games are skipped; paths are relative to the data root and sorted.
    assert ids == [
        "json_2.1.1/train/pick_heat_then_place_in_recep-Egg-None-DiningTable-12/trial_T20190908_000000_000001",
        "json_2.1.1/train/pick_heat_then_place_in_recep-Egg-None-DiningTable-12/trial_T20190908_000000_000002",
    ]
    assert [t.task_id.split("/")[1] for t in suite.eval_tasks] == ["valid_unseen"]
    env = suite.env_factory()
    obs = env.reset(suite.train_tasks[0])
    assert obs.task_description == HAND_WRITTEN_GOAL + "."
    assert "a fridge 1" in obs.text and "a sinkbasin 1" in obs.text and "a microwave 1" in obs.text
    won, steps, total = _play_expert(env, suite.train_tasks[0])
    assert won and total == SUCCESS_REWARD
    assert steps == 7  # go to fridge, open, take egg, go to microwave, heat, go to diningtable, move
    # The same seed draws the same training games.
    again = make_suite(source="official", data_dir=str(official_root), n_train=1, n_eval=1, gen_seed=5)
    assert (
        again.train_tasks
        == make_suite(source="official", data_dir=str(official_root), n_train=1, gen_seed=5).train_tasks
    )


def test_official_source_without_data_names_the_setting(monkeypatch, tmp_path):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(ValueError, match=r"env\.data_dir.*ALFWORLD_DATA"):
        make_suite(source="official")
    with pytest.raises(ValueError, match=r"no json_2\.1\.1/train folder.*env\.data_dir"):
        make_suite(source="official", data_dir=str(tmp_path))


def test_generated_suite_is_cached_picklable_and_validated(tmp_path, monkeypatch):
    monkeypatch.setenv("PROGPO_CACHE_DIR", str(tmp_path / "cache"))
    suite = make_suite(n_train=6, n_eval=6, max_steps=20, invalid_action="pass")
    assert isinstance(suite, EnvSuite) and suite.name == "alfworld" and suite.max_steps == 20
    assert len(suite.train_tasks) == 6 and len(suite.eval_tasks) == 6
    assert {t.task_type for t in suite.eval_tasks} == set(TASK_TYPES)
    assert suite.eval_fingerprint == tasks_fingerprint(suite.eval_tasks)
    factory = pickle.loads(pickle.dumps(suite.env_factory))
    assert factory == AlfWorldEnvFactory(max_steps=20, invalid_penalty=0.1, invalid_action="pass")
    (folder,) = (tmp_path / "cache" / "alfworld_games").iterdir()
    stamp = (folder / "params.json").stat().st_mtime_ns
    again = make_suite(n_train=6, n_eval=6, max_steps=20, invalid_action="pass")
    assert again.train_tasks == suite.train_tasks and (folder / "params.json").stat().st_mtime_ns == stamp
    # The held-out set does not move with the number of training games.
    assert make_suite(n_train=12, n_eval=6).eval_fingerprint == suite.eval_fingerprint
    for kwargs, field in [
        ({"source": "webshop"}, "env.source"),
        ({"invalid_action": "skip"}, "env.invalid_action"),
        ({"task_types": ["pick_and_place_simple", "fly"]}, "env.task_types"),
        ({"max_steps": 0}, "env.max_steps"),
        ({"n_train": 0}, "env.n_train"),
        ({"source": "official", "data_dir": str(tmp_path), "eval_split": "test"}, "env.eval_split"),
    ]:
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            make_suite(**kwargs)


def test_hydra_component_builds_the_suite(tmp_path, monkeypatch):
    from hydra.utils import instantiate

    monkeypatch.setenv("PROGPO_CACHE_DIR", str(tmp_path))
    cfg = OmegaConf.load(REPO / "conf" / "env" / "alfworld.yaml")
    assert cfg.source == "generated" and cfg.max_steps == 20 and list(cfg.task_types) == list(TASK_TYPES)
    cfg.n_train, cfg.n_eval = 6, 6
    suite = instantiate(cfg)
    assert isinstance(suite, EnvSuite) and len(suite.train_tasks) == 6
    assert suite.task_types == TASK_TYPES


_TRANSCRIPT_SCRIPT = r"""
import json, random, sys
from envs.alfworld import AlfWorldEnv, find_games, TASK_TYPES
from envs.base import obs_id
root, out = sys.argv[1], sys.argv[2]
env = AlfWorldEnv(max_steps=30, invalid_action="pass")
rows = []
games = find_games(root, "valid", TASK_TYPES)
for k, task in enumerate(games + games[:1] * 2):  # the last reset keeps the loaded game (and its derived texts)
    rng = random.Random(k)
    obs = env.reset(task)
    rows.append([obs.text, obs.task_description, list(obs.admissible_actions), obs_id(obs.text)])
    done = False
    while not done:
        roll = rng.random()
        action = "jump around" if roll < 0.1 else env.expert_action() if roll < 0.85 else rng.choice(obs.admissible_actions)
        obs, reward, done, info = env.step(action)
        rows.append([action, obs.text, list(obs.admissible_actions), reward, done, info.won, obs_id(obs.text)])
json.dump(rows, open(out, "w"))
"""


@pytest.mark.slow
def test_speedups_keep_transcripts_identical(alfworld_root, tmp_path):
    """The memoised engine plays exactly like the stock one; obs ids agree across processes and hash seeds."""
    outs = {}
    for flag, hash_seed in (("0", "1"), ("1", "2")):
        out = tmp_path / f"transcript-{flag}.json"
        env = dict(os.environ, PROGPO_ALFWORLD_SPEEDUPS=flag, PYTHONHASHSEED=hash_seed, PYTHONPATH=str(REPO))
        subprocess.run(
            [sys.executable, "-c", _TRANSCRIPT_SCRIPT, str(alfworld_root), str(out)],
            check=True,
            env=env,
            cwd=REPO,
            timeout=600,
        )
        outs[flag] = json.loads(out.read_text())
    assert outs["0"] == outs["1"]
    assert len(outs["1"]) > 15 and any(row[-2] for row in outs["1"] if len(row) == 7)  # some game was won
    first = outs["1"][0]
    assert first[3] == obs_id(first[0])  # same id in this process as in the children


def test_a_reused_derivation_follows_the_facts_it_read(alfworld_root):
    """A derived text is reused only while the facts it read are unchanged: remove an object from the receptacle an
    arrival feedback lists and the text is derived again, as the stock grammar derives it; put it back and the
    first text returns."""
    env = AlfWorldEnv()
    env.reset(find_games(alfworld_root, "valid", TASK_TYPES)[0])
    pddl = env._engine.unwrapped
    state, grammar, infos = pddl._pddl_state, pddl._logic.grammar, pddl._entity_infos
    stock = type(grammar).derive.__wrapped__  # the engine's own derivation, under the memo
    go_to, held = next(
        (action, fact)
        for action in state.all_applicable_actions() if action.name == "gotolocation"
        for fact in sorted(state.facts)
        if fact.name == "inreceptacle" and fact.arguments[1] in action.mapping.values()
    )

    def derived() -> tuple[str, str]:
        context = {"state": state, "facts": list(state.facts), "mapping": go_to.mapping, "entity_infos": infos,
                   "variables": {ph.name: infos[var.name] for ph, var in go_to.mapping.items()}}
        return grammar.derive(go_to.feedback_rule, dict(context)), stock(grammar, go_to.feedback_rule, dict(context))

    first, first_stock = derived()
    assert first == first_stock and derived()[0] == first
    object_name = infos[held.arguments[0].name].name
    assert object_name in first
    state.remove_fact(held)
    emptied, emptied_stock = derived()
    assert emptied == emptied_stock and object_name not in emptied
    state.add_fact(held)
    assert derived() == (first, first)

    # A game's texts live as long as it is loaded: loading another game or closing drops them.
    assert id(infos) in alfworld_engine._DERIVED
    env.reset(find_games(alfworld_root, "valid", TASK_TYPES)[1])
    assert id(infos) not in alfworld_engine._DERIVED and id(pddl._entity_infos) in alfworld_engine._DERIVED
    loaded = id(pddl._entity_infos)
    env.close()
    assert loaded not in alfworld_engine._DERIVED
