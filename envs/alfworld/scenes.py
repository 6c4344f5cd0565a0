"""Scenes of the generated ALFWorld games: the task types, which objects go where, and how a scene is drawn.

One room (kitchen, bedroom, living room or bathroom) with receptacles, closed containers, distractor objects, and the
target sometimes hidden in a closed container; ``generate.py`` writes a scene as ALFWorld game files.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field

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
