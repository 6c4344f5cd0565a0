"""``make_suite``: the Hydra ``env`` component for ALFWorld (``conf/env/alfworld.yaml``).

``source: generated`` (the offline default) writes games once with ``envs.alfworld.generate`` into a cache
folder named by a hash of the generator's parameters and re-uses them; ``source: official`` reads
``$ALFWORLD_DATA/json_2.1.1/{train,<eval_split>}``. Both are read by the same ``find_games``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Literal, get_args

from envs.alfworld.env import AlfWorldEnvFactory, InvalidAction
from envs.alfworld.games import EVAL_SELECTION_SEED, find_games, select
from envs.alfworld.generate import GENERATOR_VERSION, TASK_TYPES, SceneParams, generate
from envs.base import EnvSuite, cache_root, tasks_fingerprint

logger = logging.getLogger(__name__)

Source = Literal["generated", "official"]  # start-up validation reads the choices off this annotation
SOURCES = get_args(Source)
OFFICIAL_ROOT = "json_2.1.1"
OFFICIAL_EVAL_SPLITS = ("valid_seen", "valid_unseen", "valid_train")


def make_suite(
    source: Source = "generated",
    data_dir: str | None = None,
    n_train: int = 200,
    n_eval: int = 60,
    gen_seed: int = 0,
    task_types: Sequence[str] = TASK_TYPES,
    max_steps: int = 50,
    invalid_penalty: float = 0.1,
    invalid_action: InvalidAction = "stay",
    eval_split: str = "valid_unseen",
    scene: Mapping[str, Any] | None = None,
) -> EnvSuite:
    """Build the ALFWorld suite. Every argument is documented in ``conf/env/alfworld.yaml``."""
    scene_params = _scene_params(scene)
    task_types = tuple(str(t) for t in task_types)
    unknown = [t for t in task_types if t not in TASK_TYPES]
    if unknown or not task_types:
        raise ValueError(f"env.task_types: unknown {unknown or 'empty list'}; choose from {list(TASK_TYPES)}")
    factory = AlfWorldEnvFactory(
        max_steps=max_steps, invalid_penalty=invalid_penalty, invalid_action=invalid_action
    )
    if source == "generated":
        if n_train < 1 or n_eval < 1:
            raise ValueError(
                f"env.n_train and env.n_eval must be >= 1 for generated games, got {n_train}, {n_eval}"
            )
        root = ensure_generated(data_dir, n_train, n_eval, gen_seed, task_types, scene_params)
        train = find_games(root, "train", task_types)
        evaluation = find_games(root, "valid", task_types)
    elif source == "official":
        if eval_split not in OFFICIAL_EVAL_SPLITS:
            raise ValueError(f"env.eval_split must be one of {OFFICIAL_EVAL_SPLITS}, got {eval_split!r}")
        root = _official_root(data_dir)
        train = select(find_games(root, f"{OFFICIAL_ROOT}/train", task_types), n_train, gen_seed)
        evaluation = select(
            find_games(root, f"{OFFICIAL_ROOT}/{eval_split}", task_types), n_eval, EVAL_SELECTION_SEED
        )
    else:
        raise ValueError(f"env.source must be one of {SOURCES}, got {source!r}")
    if not train or not evaluation:
        raise ValueError(f"no ALFWorld games of types {list(task_types)} found under {root} (env.data_dir)")
    overlap = {t.task_id for t in train} & {t.task_id for t in evaluation}
    if overlap:
        raise ValueError(f"train and held-out ALFWorld tasks overlap: {sorted(overlap)[:3]}")
    logger.info("ALFWorld (%s, %s): %d train / %d held-out games", source, root, len(train), len(evaluation))
    return EnvSuite(
        name="alfworld",
        env_factory=factory,
        train_tasks=train,
        eval_tasks=evaluation,
        eval_fingerprint=tasks_fingerprint(evaluation),
        max_steps=max_steps,
        task_types=task_types,
    )


def _official_root(data_dir: str | None) -> Path:
    root = data_dir or os.environ.get("ALFWORLD_DATA")
    if not root:
        raise ValueError(
            "env.source=official needs the ALFWorld data: set env.data_dir=/path/to/alfworld_data or the "
            "ALFWORLD_DATA environment variable (the folder holding json_2.1.1/)"
        )
    path = Path(root).expanduser()
    if not (path / OFFICIAL_ROOT / "train").is_dir():
        raise ValueError(
            f"{path} has no {OFFICIAL_ROOT}/train folder: point env.data_dir (or ALFWORLD_DATA) at the folder "
            "that `alfworld-download` filled"
        )
    return path


def _scene_params(scene: Mapping[str, Any] | None) -> SceneParams:
    known = {f.name for f in fields(SceneParams)}
    unknown = sorted(set(scene or {}) - known)
    if unknown:
        raise ValueError(f"unknown key(s) env.scene.{', env.scene.'.join(unknown)}; allowed: {sorted(known)}")
    return SceneParams(**dict(scene or {}))


def generator_params(
    n_train: int,
    n_eval: int,
    gen_seed: int,
    task_types: tuple[str, ...],
    scene_params: SceneParams = SceneParams(),
) -> dict:
    params = {
        "generator_version": GENERATOR_VERSION,
        "n_train": n_train,
        "n_eval": n_eval,
        "seed": gen_seed,
        "task_types": list(task_types),
    }
    if scene_params != SceneParams():  # the standard scenes keep the cache key they always had
        params["scene"] = asdict(scene_params)
    return params


def default_games_dir(params: dict) -> Path:
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / "alfworld_games" / digest


def ensure_generated(
    data_dir: str | None,
    n_train: int,
    n_eval: int,
    gen_seed: int,
    task_types: tuple[str, ...],
    scene_params: SceneParams = SceneParams(),
) -> Path:
    """The folder of generated games for these parameters, written once (atomically) and re-used after."""
    params = generator_params(n_train, n_eval, gen_seed, task_types, scene_params)
    root = Path(data_dir).expanduser() if data_dir else default_games_dir(params)
    marker = root / "params.json"
    if marker.is_file():
        found = json.loads(marker.read_text(encoding="utf-8"))
        if found != params:
            raise ValueError(
                f"env.data_dir={root} holds games generated with {found}, not {params}: "
                "leave env.data_dir null (one cache folder per setting) or point it at an empty folder"
            )
        return root
    if root.exists() and any(root.iterdir()):
        raise ValueError(f"env.data_dir={root} is not empty and holds no params.json: choose an empty folder")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    logger.info("generating %d + %d ALFWorld games into %s", n_train, n_eval, root)
    generate(tmp, n_train, n_eval, gen_seed, task_types, scene_params)
    (tmp / "params.json").write_text(json.dumps(params, sort_keys=True), encoding="utf-8")
    try:
        if root.exists():
            root.rmdir()  # an empty folder the user pointed us at
        os.rename(tmp, root)
    except OSError:
        if not marker.is_file():  # another process did not win the race: a real error
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return root
