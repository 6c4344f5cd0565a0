"""Generator of small ALFWorld games: ``traj_data.json`` + ``game.tw-pddl`` in the official layout.

The official data cannot be downloaded here, so the offline default env plays games written by this module.
They use ALFWorld's own PDDL domain, grammar and goal formulas (``alfworld.gen.goal_library``) and are played
by the same engine as the official games; only the scenes are ours: one room (kitchen, bedroom, living room or
bathroom) with 5-8 receptacles, closed containers, distractor objects, and the target sometimes hidden in a
closed container. ALFWorld's planner expert solves them in about 3-15 steps.

Every game is a pure function of ``(seed, split, index)``, so the same seed writes byte-identical files on any
machine. The held-out split ("valid") does not depend on the number of training games, and a training game
whose scene equals a held-out one (same type, objects, receptacles and placement) is drawn again.

CLI: ``python -m envs.alfworld.generate --out DIR --n 300 --n-eval 60 --seed 0``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path

from envs.alfworld.scenes import (  # noqa: F401 - TASK_LABELS, TASK_TYPES, SceneParams are re-exported
    CAN_CONTAIN,
    CLEANABLE,
    COOLABLE,
    HEATABLE,
    LAMP,
    OPENABLE,
    RECEPTACLE_OBJECTS,
    TASK_LABELS,
    TASK_TYPES,
    Scene,
    SceneParams,
    sample_scene,
)

logger = logging.getLogger(__name__)

GENERATOR_VERSION = 1  # bump when the output of a given seed changes (it is part of the cache key)

@dataclass(frozen=True)
class GeneratedGame:
    game_dir: str  # relative to the output folder, posix separators
    task_type: str
    signature: str


def _mangle(alfred_id: str) -> str:
    """ALFRED's object id -> PDDL name (``Apple|+01.00|...`` -> ``Apple_bar__plus_01_dot_00_...``)."""
    for a, b in (("|", "_bar_"), ("+", "_plus_"), ("-", "_minus_"), (".", "_dot_"), (",", "_comma_")):
        alfred_id = alfred_id.replace(a, b)
    return alfred_id


def _unique_ids(classes: list[str], rng: random.Random, taken: set[str]) -> list[str]:
    ids = []
    for cls in classes:
        while True:
            x, y, z = (rng.uniform(-3.5, 3.5) for _ in range(3))
            name = f"{cls}|{x:+06.2f}|{abs(y):+06.2f}|{z:+06.2f}"
            if cls == "SinkBasin":
                name = f"Sink|{x:+06.2f}|{abs(y):+06.2f}|{z:+06.2f}|SinkBasin"
            elif cls == "BathtubBasin":
                name = f"Bathtub|{x:+06.2f}|{abs(y):+06.2f}|{z:+06.2f}|BathtubBasin"
            name = _mangle(name)
            if name not in taken:
                taken.add(name)
                ids.append(name)
                break
    return ids


def _unique_locations(n: int, rng: random.Random) -> list[str]:
    locations: list[str] = []
    while len(locations) < n:
        loc = _mangle(
            f"loc|{rng.randint(-9, 9)}|{rng.randint(-9, 9)}|{rng.randint(0, 3)}|{rng.choice((0, 30, 45, 60))}"
        )
        if loc not in locations:
            locations.append(loc)
    return locations


def scene_to_pddl(scene: Scene, name: str, rng: random.Random) -> str:
    """The PDDL problem of a scene, in the shape of ALFWorld's problems (``alfworld.gen`` planned states)."""
    from alfworld.gen import goal_library

    taken: set[str] = set()
    recep_ids = _unique_ids(scene.receptacles, rng, taken)
    object_ids = _unique_ids([cls for cls, _ in scene.objects], rng, taken)
    start, *recep_locs = _unique_locations(len(recep_ids) + 1, rng)

    object_classes = sorted({cls for cls, _ in scene.objects} | {"Knife", "ButterKnife"})
    recep_classes = sorted(set(scene.receptacles) | {"SinkBasin", "Microwave", "Fridge"})
    declared = ["agent1 - agent"]
    declared += [f"{cls}Type - otype" for cls in object_classes]
    declared += [f"{cls}Type - rtype" for cls in recep_classes]
    declared += [f"{oid} - object" for oid in sorted(object_ids)]
    declared += [f"{rid} - receptacle" for rid in sorted(recep_ids)]
    declared += [f"{loc} - location" for loc in sorted([start, *recep_locs])]

    init = [f"(atLocation agent1 {start})"]
    for rid, cls, loc in zip(recep_ids, scene.receptacles, recep_locs):
        init.append(f"(receptacleType {rid} {cls}Type)")
        init.append(f"(receptacleAtLocation {rid} {loc})")
        if cls in OPENABLE:
            init.append(f"(openable {rid})")
    for oid, (cls, slot) in zip(object_ids, scene.objects):
        init.append(f"(objectType {oid} {cls}Type)")
        init.append(f"(inReceptacle {oid} {recep_ids[slot]})")
        init.append(f"(objectAtLocation {oid} {recep_locs[slot]})")
        if cls == LAMP:
            init.append(f"(toggleable {oid})")
            continue
        init.append(f"(pickupable {oid})")
        for prop, members in (("cleanable", CLEANABLE), ("heatable", HEATABLE), ("coolable", COOLABLE)):
            if cls in members:
                init.append(f"({prop} {oid})")
        if cls in RECEPTACLE_OBJECTS:
            init.append(f"(isReceptacleObject {oid})")
    present = {cls for cls, _ in scene.objects}
    for rcls in sorted(set(scene.receptacles)):
        init += [f"(canContain {rcls}Type {ocls}Type)" for ocls in CAN_CONTAIN[rcls] if ocls in present]

    goal = goal_library.gdict[scene.task_type]["pddl"].format(
        obj=scene.target, recep=scene.parent, toggle=LAMP, mrecep=""
    )
    goal = goal.replace("#", "-")
    lines = [f"(define (problem {name})", "    (:domain alfred)", "    (:objects"]
    lines += [f"        {d}" for d in declared]
    lines += ["    )", "    (:init", "        (= (total-cost) 0)"]
    lines += [f"        {f}" for f in init]
    lines += ["    )", goal.rstrip()]
    return "\n".join(lines) + "\n"


def game_files(scene: Scene, problem: str) -> tuple[dict, dict]:
    """(traj_data, game.tw-pddl) contents for a scene, as ``AlfredTWEnv`` and ``alfworld-generate`` write them."""
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    traj_data = {
        "task_type": scene.task_type,
        "pddl_params": {
            "object_target": scene.target,
            "parent_target": scene.parent,
            "toggle_target": LAMP if scene.task_type == "look_at_obj_in_light" else "",
            "mrecep_target": "",
            "object_sliced": False,
        },
        "turk_annotations": {"anns": [{"task_desc": scene.description}]},
        "scene": {
            "generator": "progpo",
            "generator_version": GENERATOR_VERSION,
            "room": scene.theme,
            "signature": scene.signature(),
        },
    }
    domain = Path(ALFRED_PDDL_PATH).read_text(encoding="utf-8")
    # What alfworld.agents.utils.misc.add_task_to_grammar does, with the template drawn from our seeded rng.
    grammar = Path(ALFRED_TWL2_PATH).read_text(encoding="utf-8").replace("UNKNOWN GOAL", scene.description)
    game = {
        "pddl_domain": domain,
        "grammar": grammar,
        "pddl_problem": problem,
        "solvable": True,
        "walkthrough": None,
    }
    return traj_data, game


def generate_split(
    out: str | os.PathLike,
    split: str,
    n: int,
    seed: int,
    task_types: tuple[str, ...] = TASK_TYPES,
    avoid: set[str] | None = None,
    scene_params: SceneParams = SceneParams(),
) -> list[GeneratedGame]:
    """Write ``n`` games under ``out/split``. Game ``i`` has type ``task_types[i % len]`` and depends only on
    ``(seed, split, i)``; a scene whose signature is in ``avoid`` (or repeats an earlier one) is drawn again."""
    unknown = [t for t in task_types if t not in TASK_TYPES]
    if unknown or not task_types:
        raise ValueError(f"env.task_types: unknown {unknown or 'empty list'}; choose from {list(TASK_TYPES)}")
    seen = set(avoid or ())
    games = []
    for i in range(n):
        task_type = task_types[i % len(task_types)]
        for attempt in range(1000):
            rng = random.Random(f"progpo-alfworld:{GENERATOR_VERSION}:{seed}:{split}:{i}:{attempt}")
            scene = sample_scene(task_type, rng, scene_params)
            sig = scene.signature()
            if sig not in seen:
                break
        else:  # pragma: no cover - the scene space is far larger than any split
            raise RuntimeError(f"could not draw a new {task_type} scene for game {i} of {split}")
        seen.add(sig)
        problem = scene_to_pddl(scene, f"plan_progpo_{seed}_{split}_{i}", rng)
        traj_data, game = game_files(scene, problem)
        parent = scene.parent or "None"
        game_dir = f"{split}/{task_type}-{scene.target}-None-{parent}-s{seed}/trial_{i:05d}"
        folder = Path(out, game_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "traj_data.json").write_text(
            json.dumps(traj_data, indent=2, sort_keys=True), encoding="utf-8"
        )
        (folder / "game.tw-pddl").write_text(json.dumps(game, sort_keys=True), encoding="utf-8")
        games.append(GeneratedGame(game_dir, task_type, sig))
    return games


def generate(
    out: str | os.PathLike,
    n_train: int,
    n_eval: int,
    seed: int = 0,
    task_types: tuple[str, ...] = TASK_TYPES,
    scene_params: SceneParams = SceneParams(),
) -> dict:
    """Write a training split ("train") and a disjoint held-out split ("valid") under ``out``; returns a manifest."""
    if n_train < 0 or n_eval < 0:
        raise ValueError(f"numbers of games must be >= 0, got n_train={n_train}, n_eval={n_eval}")
    valid = generate_split(out, "valid", n_eval, seed, task_types, scene_params=scene_params)
    train = generate_split(
        out, "train", n_train, seed, task_types, avoid={g.signature for g in valid}, scene_params=scene_params
    )
    manifest = {
        "generator_version": GENERATOR_VERSION,
        "seed": seed,
        "task_types": list(task_types),
        "train": [g.game_dir for g in train],
        "valid": [g.game_dir for g in valid],
    }
    Path(out, "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder (gets train/, valid/ and manifest.json)")
    parser.add_argument("--n", type=int, default=300, help="number of training games")
    parser.add_argument("--n-eval", type=int, default=60, help="number of held-out games")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task-types", nargs="+", default=list(TASK_TYPES), choices=TASK_TYPES)
    args = parser.parse_args(argv)
    manifest = generate(args.out, args.n, args.n_eval, args.seed, tuple(args.task_types))
    print(f"wrote {len(manifest['train'])} train and {len(manifest['valid'])} held-out games to {args.out}")  # noqa: T201


if __name__ == "__main__":
    main()
