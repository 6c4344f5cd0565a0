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
import hashlib
import json
import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

GENERATOR_VERSION = 1  # bump when the output of a given seed changes (it is part of the cache key)

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# The paper's column titles for the task types (Table 1), in its column order.
TASK_LABELS: dict[str, str] = {
    "pick_and_place_simple": "Pick",
    "pick_clean_then_place_in_recep": "Clean",
    "pick_cool_then_place_in_recep": "Cool",
    "look_at_obj_in_light": "Look",
    "pick_heat_then_place_in_recep": "Heat",
    "pick_two_obj_and_place": "Pick2",
}

# Which object classes each receptacle class may hold: ALFWorld's ``constants.VAL_RECEPTACLE_OBJECTS`` restricted
# to the classes used here. Frozen in this file so that a given seed always writes the same games.
CAN_CONTAIN: dict[str, tuple[str, ...]] = {
    k: tuple(v.split())
    for k, v in {
        "ArmChair": "Book CellPhone Cloth CreditCard KeyChain Laptop Newspaper Pillow RemoteControl",
        "BathtubBasin": "Cloth DishSponge SoapBar",
        "Bed": "Book CellPhone Laptop Newspaper Pillow",
        "Cabinet": "Book Bowl CD Candle Cloth Cup DishSponge Kettle Ladle Mug Newspaper Pan PepperShaker Plate "
        "Pot SaltShaker SoapBar SoapBottle SprayBottle TissueBox ToiletPaper Vase WineBottle",
        "Cart": "Candle Cloth DishSponge Mug SoapBar SoapBottle SprayBottle Statue TissueBox ToiletPaper Vase",
        "CoffeeMachine": "Mug",
        "CoffeeTable": "AlarmClock Apple Book Bowl Bread ButterKnife CD Candle CellPhone Cloth CreditCard Cup "
        "DishSponge Egg Fork Kettle KeyChain Knife Ladle Laptop Lettuce Mug Newspaper Pan Pen Pencil "
        "PepperShaker Plate Pot Potato RemoteControl SaltShaker SoapBar SoapBottle Spatula Spoon SprayBottle "
        "Statue TissueBox ToiletPaper Tomato Vase Watch WineBottle",
        "CounterTop": "AlarmClock Apple Book Bowl Bread ButterKnife CD Candle CellPhone Cloth CreditCard Cup "
        "DishSponge Egg Fork Kettle KeyChain Knife Ladle Laptop Lettuce Mug Newspaper Pan Pen Pencil "
        "PepperShaker Plate Pot Potato RemoteControl SaltShaker SoapBar SoapBottle Spatula Spoon SprayBottle "
        "Statue TissueBox ToiletPaper Tomato Vase Watch WineBottle",
        "Desk": "AlarmClock Book Bowl CD Candle CellPhone Cloth CreditCard Cup KeyChain Laptop Mug Newspaper "
        "Pen Pencil Plate RemoteControl SoapBottle SprayBottle Statue TissueBox ToiletPaper Vase Watch WineBottle",
        "DiningTable": "AlarmClock Apple Book Bowl Bread ButterKnife CD Candle CellPhone Cloth CreditCard Cup "
        "DishSponge Egg Fork Kettle KeyChain Knife Ladle Laptop Lettuce Mug Newspaper Pan Pen Pencil "
        "PepperShaker Plate Pot Potato RemoteControl SaltShaker SoapBar SoapBottle Spatula Spoon SprayBottle "
        "Statue TissueBox ToiletPaper Tomato Vase Watch WineBottle",
        "Drawer": "Book ButterKnife CD Candle CellPhone Cloth CreditCard DishSponge Fork KeyChain Knife Ladle "
        "Newspaper Pen Pencil PepperShaker RemoteControl SaltShaker SoapBar SoapBottle Spatula Spoon "
        "SprayBottle TissueBox ToiletPaper Watch",
        "Dresser": "AlarmClock Book Bowl CD Candle CellPhone Cloth CreditCard Cup KeyChain Laptop Mug Newspaper "
        "Pen Pencil Plate RemoteControl SprayBottle Statue TissueBox ToiletPaper Vase Watch WineBottle",
        "Fridge": "Apple Bowl Bread Cup Egg Lettuce Mug Pan Plate Pot Potato Tomato WineBottle",
        "GarbageCan": "Apple Bread CD Cloth DishSponge Egg Lettuce Newspaper Pen Pencil Potato SoapBar "
        "SoapBottle SprayBottle TissueBox ToiletPaper Tomato WineBottle",
        "Microwave": "Apple Bowl Bread Cup Egg Mug Plate Potato Tomato",
        "Ottoman": "Book CellPhone Cloth CreditCard KeyChain Laptop Newspaper Pillow RemoteControl",
        "Safe": "CD CellPhone CreditCard KeyChain Statue Vase Watch",
        "Shelf": "AlarmClock Book Bowl CD Candle CellPhone Cloth CreditCard Cup DishSponge Kettle KeyChain Mug "
        "Newspaper Pen Pencil PepperShaker Plate Pot RemoteControl SaltShaker SoapBar SoapBottle SprayBottle "
        "Statue TissueBox ToiletPaper Vase Watch WineBottle",
        "SideTable": "AlarmClock Apple Book Bowl Bread ButterKnife CD Candle CellPhone Cloth CreditCard Cup "
        "DishSponge Egg Fork Kettle KeyChain Knife Ladle Laptop Lettuce Mug Newspaper Pan Pen Pencil "
        "PepperShaker Plate Pot Potato RemoteControl SaltShaker SoapBar SoapBottle Spatula Spoon SprayBottle "
        "Statue TissueBox ToiletPaper Tomato Vase Watch WineBottle",
        "SinkBasin": "Apple Bowl ButterKnife Cloth Cup DishSponge Egg Fork Kettle Knife Ladle Lettuce Mug Pan "
        "Plate Pot Potato SoapBar Spatula Spoon Tomato",
        "Sofa": "Book CellPhone Cloth CreditCard KeyChain Laptop Newspaper Pillow RemoteControl",
        "StoveBurner": "Kettle Pan Pot",
        "Toilet": "Candle Cloth DishSponge Newspaper SoapBar SoapBottle SprayBottle TissueBox ToiletPaper",
    }.items()
}
# ALFWorld's ``constants.VAL_ACTION_OBJECTS`` restricted the same way.
HEATABLE = frozenset("Apple Bread Cup Egg Mug Plate Potato Tomato".split())
COOLABLE = frozenset("Apple Bowl Bread Cup Egg Lettuce Mug Pan Plate Pot Potato Tomato WineBottle".split())
CLEANABLE = frozenset(
    "Apple Bowl ButterKnife Cloth Cup DishSponge Egg Fork Kettle Knife Ladle Lettuce Mug Pan Plate Pot Potato "
    "SoapBar Spatula Spoon Tomato".split()
)
RECEPTACLE_OBJECTS = frozenset("Bowl Cup Mug Pan Plate Pot".split())  # ALFRED's movable receptacles
OPENABLE = frozenset("Cabinet Drawer Fridge Microwave Safe".split())
LAMP = "DeskLamp"
LAMP_HOLDERS = ("Desk", "Dresser", "SideTable")
LOOKABLE = tuple(
    "AlarmClock Book Bowl CD CellPhone Cloth CreditCard KeyChain Laptop Mug Newspaper Pen Pencil Pillow "
    "RemoteControl Statue TissueBox Vase Watch".split()
)
MAX_INSTANCES = {"Cabinet": 4, "Drawer": 4, "Shelf": 3, "CounterTop": 2, "SideTable": 2, "StoveBurner": 2}

THEMES: dict[str, tuple[str, ...]] = {
    k: tuple(v.split())
    for k, v in {
        "kitchen": "Cabinet CoffeeMachine CounterTop DiningTable Drawer Fridge GarbageCan Microwave Shelf SideTable "
        "SinkBasin StoveBurner",
        "bedroom": "ArmChair Bed Desk Drawer Dresser GarbageCan Safe Shelf SideTable",
        "living": "ArmChair Cabinet CoffeeTable DiningTable Drawer Dresser GarbageCan Ottoman Shelf SideTable Sofa",
        "bathroom": "BathtubBasin Cabinet Cart CounterTop Drawer GarbageCan Shelf SinkBasin Toilet",
    }.items()
}

# Per task type: the appliance the object must visit, the rooms it can happen in, the objects it applies to.
TOOL = {
    "pick_clean_then_place_in_recep": "SinkBasin",
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
}
TASK_THEMES = {
    "pick_and_place_simple": ("kitchen", "bedroom", "living", "bathroom"),
    "pick_two_obj_and_place": ("kitchen", "bedroom", "living", "bathroom"),
    "pick_clean_then_place_in_recep": ("kitchen", "bathroom"),
    "pick_heat_then_place_in_recep": ("kitchen",),
    "pick_cool_then_place_in_recep": ("kitchen",),
    "look_at_obj_in_light": ("bedroom", "living"),
}
ALL_OBJECTS = tuple(sorted({o for objs in CAN_CONTAIN.values() for o in objs}))
TASK_OBJECTS = {
    "pick_and_place_simple": ALL_OBJECTS,
    "pick_two_obj_and_place": ALL_OBJECTS,
    "pick_clean_then_place_in_recep": tuple(sorted(CLEANABLE)),
    "pick_heat_then_place_in_recep": tuple(sorted(HEATABLE)),
    "pick_cool_then_place_in_recep": tuple(sorted(COOLABLE)),
    "look_at_obj_in_light": LOOKABLE,
}
HIDE_PROB = 0.7  # chance that the first target starts inside a closed container (when the room has one)
CLOSED_PARENT_PROB = 0.4  # chance that the goal receptacle is a closed one (cabinet, drawer, fridge, ...)


@dataclass(frozen=True)
class SceneParams:
    """How hard the generated scenes are. The defaults are the standard set; smaller rooms with fewer
    distractors and fewer hidden targets make an easier set (the CPU default, see ``conf/env/alfworld.yaml``)."""

    min_receptacles: int = 5
    max_receptacles: int = 8
    min_distractors: int = 2
    max_distractors: int = 6
    hide_prob: float = HIDE_PROB
    closed_parent_prob: float = CLOSED_PARENT_PROB

    def __post_init__(self) -> None:
        if not 2 <= self.min_receptacles <= self.max_receptacles:
            raise ValueError(
                f"env.scene: need 2 <= min_receptacles <= max_receptacles, got "
                f"{self.min_receptacles}, {self.max_receptacles}"
            )
        if not 0 <= self.min_distractors <= self.max_distractors:
            raise ValueError(
                f"env.scene: need 0 <= min_distractors <= max_distractors, got "
                f"{self.min_distractors}, {self.max_distractors}"
            )
        for name in ("hide_prob", "closed_parent_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"env.scene.{name} must be in [0, 1], got {getattr(self, name)}")


@dataclass
class Scene:
    """A generated game before it is written as PDDL: receptacle classes and object placements."""

    task_type: str
    theme: str
    target: str
    parent: str  # "" for look_at_obj_in_light
    receptacles: list[str]  # receptacle class per receptacle slot
    objects: list[tuple[str, int]] = field(default_factory=list)  # (object class, receptacle slot)
    description: str = ""

    def signature(self) -> str:
        """Semantic identity (type, goal, room contents): equal for scenes an agent could not tell apart."""
        contents = sorted(
            (cls, tuple(sorted(o for o, slot in self.objects if slot == i)))
            for i, cls in enumerate(self.receptacles)
        )
        key = json.dumps([self.task_type, self.target, self.parent, self.description, contents])
        return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class GeneratedGame:
    game_dir: str  # relative to the output folder, posix separators
    task_type: str
    signature: str


def _goal_text(task_type: str, target: str, parent: str, rng: random.Random) -> str:
    from alfworld.gen import goal_library

    template = rng.choice(goal_library.gdict[task_type]["templates"])
    return template.format(obj=target.lower(), recep=parent.lower(), toggle=LAMP.lower(), mrecep="")


def sample_scene(task_type: str, rng: random.Random, params: SceneParams = SceneParams()) -> Scene:
    """Draw one scene for ``task_type`` (see the module docstring for what varies)."""
    tool = TOOL.get(task_type, "")
    theme = rng.choice(TASK_THEMES[task_type])
    room = THEMES[theme]
    fits = {o: [r for r in room if o in CAN_CONTAIN[r]] for o in ALL_OBJECTS}
    candidates = []
    for obj in TASK_OBJECTS[task_type]:
        holders = fits.get(obj, [])
        if task_type == "look_at_obj_in_light":
            if holders:
                candidates.append((obj, ""))
            continue
        for parent in holders:
            if parent == tool or (parent == "CoffeeMachine" and task_type == "pick_two_obj_and_place"):
                continue
            if any(src != parent for src in holders):
                candidates.append((obj, parent))
    closed_parents = [c for c in candidates if c[1] in OPENABLE]
    if closed_parents and rng.random() < params.closed_parent_prob:
        candidates = closed_parents
    target, parent = rng.choice(candidates)

    # Required receptacles first: the parent, the appliance or lamp holder, and where the target starts.
    receptacles: list[str] = []
    if parent:
        receptacles.append(parent)
    if tool and tool not in receptacles:
        receptacles.append(tool)
    lamp_slot = -1
    if task_type == "look_at_obj_in_light":
        holder = rng.choice([h for h in LAMP_HOLDERS if h in room])
        receptacles.append(holder)
        lamp_slot = len(receptacles) - 1
    sources = [r for r in fits[target] if r != parent]
    if lamp_slot >= 0 and len(sources) > 1:  # keep the target off the lamp's own table when possible
        holder_full = receptacles.count(receptacles[lamp_slot]) >= MAX_INSTANCES.get(
            receptacles[lamp_slot], 1
        )
        sources = [r for r in sources if not (holder_full and r == receptacles[lamp_slot])]
    hidden = [r for r in sources if r in OPENABLE]
    source = rng.choice(hidden) if hidden and rng.random() < params.hide_prob else rng.choice(sources)
    if receptacles.count(source) >= MAX_INSTANCES.get(source, 1):
        source_slot = receptacles.index(source)  # e.g. the sink of a clean task: the target starts in it
    else:
        receptacles.append(source)
        source_slot = len(receptacles) - 1

    n_receptacles = rng.randint(params.min_receptacles, params.max_receptacles)
    while len(receptacles) < n_receptacles:
        cls = rng.choice(room)
        if receptacles.count(cls) < MAX_INSTANCES.get(cls, 1):
            receptacles.append(cls)

    # Targets: 2-3 for pick_two, 1-2 otherwise; never in a receptacle of the parent's class (or the lamp's).
    target_slots = [
        i for i, r in enumerate(receptacles) if r != parent and target in CAN_CONTAIN[r] and i != lamp_slot
    ]
    n_targets = rng.choice((2, 2, 3)) if task_type == "pick_two_obj_and_place" else rng.choice((1, 1, 1, 2))
    objects = [(target, source_slot)]
    objects += [(target, rng.choice(target_slots)) for _ in range(n_targets - 1)]
    if lamp_slot >= 0 or (any(r in LAMP_HOLDERS for r in receptacles) and rng.random() < 0.5):
        slot = (
            lamp_slot
            if lamp_slot >= 0
            else rng.choice([i for i, r in enumerate(receptacles) if r in LAMP_HOLDERS])
        )
        objects.append((LAMP, slot))

    # Distractors: other objects that fit somewhere in the room (possibly in the parent).
    others = [o for o in ALL_OBJECTS if o != target and any(o in CAN_CONTAIN[r] for r in receptacles)]
    for _ in range(rng.randint(params.min_distractors, params.max_distractors)):
        obj = rng.choice(others)
        objects.append((obj, rng.choice([i for i, r in enumerate(receptacles) if obj in CAN_CONTAIN[r]])))

    description = _goal_text(task_type, target, parent, rng)
    return Scene(task_type, theme, target, parent, receptacles, objects, description)


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
