"""What a run records about itself: flattened config params, git state and grouping tags."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from progpo.hardware import machine_label

log = logging.getLogger(__name__)

# MLflow 3 limits (mlflow.utils.validation): keys up to 250 characters, param values up to 6000,
# tag values up to 8000; keys may hold only alphanumerics, "_", "-", ".", " ", "/" and ":".
MAX_KEY_LENGTH = 250
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000
_BAD_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-. /:]")

# The config groups whose choice names a run (tag name -> Hydra group).
MACHINE_TAG = "machine"  # progpo.hardware.machine_label(): runs of different CPUs are not like for like
CHOICE_TAGS = {"method": "credit", "env": "env", "model": "model", "experiment": "experiment", "ablation": "ablation"}


def to_container(cfg: Any) -> dict[str, Any]:
    """A plain dict of ``cfg`` (resolved where possible; the ``hydra`` node is dropped)."""
    if isinstance(cfg, DictConfig):
        try:
            data = OmegaConf.to_container(cfg, resolve=True)
        except Exception as error:  # e.g. ${hydra:...} outside a Hydra app
            log.warning("config could not be fully resolved for tracking (%s); logging it unresolved", error)
            data = OmegaConf.to_container(cfg, resolve=False)
    elif isinstance(cfg, Mapping):
        data = dict(cfg)
    else:
        raise TypeError(f"cfg must be a DictConfig or a mapping, got {type(cfg).__name__}")
    data.pop("hydra", None)
    return data


def clip(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[: limit - 3] + "..."


def flatten_params(cfg: Any, sep: str = ".") -> dict[str, str]:
    """Flatten a config into MLflow params: dotted keys, JSON for lists, values clipped to MLflow's limits."""
    out: dict[str, str] = {}

    def visit(prefix: str, node: Any) -> None:
        if isinstance(node, Mapping) and node:
            for key, value in node.items():
                visit(f"{prefix}{sep}{key}" if prefix else str(key), value)
            return
        if isinstance(node, (list, tuple)):
            text = json.dumps(list(node), default=str)
        elif isinstance(node, Mapping):
            text = "{}"
        else:
            text = str(node)
        key = clip(_BAD_KEY_CHARS.sub("_", prefix), MAX_KEY_LENGTH)
        out[key] = clip(text, MAX_PARAM_VALUE_LENGTH)

    visit("", to_container(cfg))
    return out


@dataclass(frozen=True)
class GitInfo:
    """The code state a run was produced with."""

    commit: str  # full sha, or "unknown" outside a git checkout
    branch: str
    dirty: bool


def git_info(path: str | Path | None = None) -> GitInfo:
    """Git commit, branch and dirty flag of the checkout holding ``path`` (default: this package).

    Outside a checkout the commit is ``$PROGPO_GIT_COMMIT`` (set by the Docker image's build argument) or "unknown".
    """
    where = Path(path) if path is not None else Path(__file__).resolve().parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10, check=True)
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError):  # no checkout (e.g. a Docker image): the build argument
        return GitInfo(commit=os.environ.get("PROGPO_GIT_COMMIT", "unknown"), branch="unknown", dirty=False)
    try:
        branch = git("rev-parse", "--abbrev-ref", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        branch, dirty = "unknown", False
    return GitInfo(commit=commit, branch=branch, dirty=dirty)


def hydra_runtime() -> tuple[dict[str, str], str | None, list[str]]:
    """(group choices, multirun sweep dir or None, task overrides) of the current Hydra job, if any."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if not HydraConfig.initialized():
            return {}, None, []
        hc = HydraConfig.get()
        choices = {str(k): str(v) for k, v in hc.runtime.choices.items() if v is not None}
        sweep_dir = str(hc.sweep.dir) if hc.mode == RunMode.MULTIRUN else None
        overrides = [str(o) for o in hc.overrides.task]
        return choices, sweep_dir, overrides
    except Exception as error:  # a half-set HydraConfig (e.g. compose without hydra node) is not fatal
        log.debug("no Hydra runtime information: %s", error)
        return {}, None, []


def _method_from_cfg(container: Mapping[str, Any]) -> str | None:
    credit = container.get("credit")
    if not isinstance(credit, Mapping):
        return None
    if credit.get("name"):
        return str(credit["name"])
    target = credit.get("_target_")
    return str(target).rsplit(".", 1)[-1].lower() if target else None


def derive_tags(cfg: Any, experiment_name: str, group: str | None) -> dict[str, str]:
    """Tags that let a report or the MLflow UI group runs: method, env, model, seed, group, overrides."""
    container = to_container(cfg)
    choices, sweep_dir, overrides = hydra_runtime()
    tags: dict[str, str] = {}
    for tag, hydra_group in CHOICE_TAGS.items():
        if hydra_group in choices:
            tags[tag] = choices[hydra_group]
    tags.setdefault("method", _method_from_cfg(container) or "unknown")
    for tag in ("env", "model"):
        node = container.get(tag)
        if tag not in tags and isinstance(node, Mapping) and node.get("name"):
            tags[tag] = str(node["name"])
    if "seed" in container:
        tags["seed"] = str(container["seed"])
    tags["group"] = group or sweep_dir or experiment_name
    tags[MACHINE_TAG] = machine_label()
    if overrides:
        tags["hydra_overrides"] = clip(" ".join(overrides), MAX_TAG_VALUE_LENGTH)
    return tags


# The process that logs a run, as "<host>/<pid>/<process start time>": lets `progpo.report` tell a RUNNING run whose
# process was killed (same host, that process gone) from one still training.
PROCESS_TAG = "progpo.process"


def process_id(pid: int | None = None) -> str:
    """``<host>/<pid>/<start time>`` of this process (or of ``pid``); the start time guards against reused pids."""
    import psutil

    process = psutil.Process(pid)
    return f"{socket.gethostname()}/{process.pid}/{process.create_time():.2f}"


def process_is_gone(tag: str) -> bool:
    """True when ``tag`` (a ``process_id``) names a process of this host that no longer runs.

    False when it still runs, and for another host (or a malformed tag): there it cannot be checked.
    """
    import psutil

    host, _, rest = tag.partition("/")
    pid, _, started = rest.partition("/")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        process = psutil.Process(int(pid))
        return f"{process.create_time():.2f}" != started or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
