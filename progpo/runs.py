"""A run's identity and its folder: name, run directory, the checkpoint to resume, the saved config.

One helper per concept, shared by ``train``, ``sweep`` and the tests.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from progpo.config import ConfigError, world_size_mismatch

log = logging.getLogger(__name__)

_RESUME_KEYS = ("resume", "ckpt_path")


def env_name(target: str) -> str:
    """The env's part of a run name, from its builder: ``envs.<module>.make_suite`` -> ``<module>``,
    ``envs.<module>.make_<variant>_suite`` -> ``<module>_<variant>`` (``envs.webshop.make_real_suite`` ->
    ``webshop_real``), so each ``conf/env`` file names its runs as the file is named."""
    parts = str(target).split(".")
    if len(parts) < 3:
        return "env"
    builder = parts[-1]
    variant = builder[len("make_"):-len("_suite")] if builder.startswith("make_") and builder.endswith("_suite") else ""
    return f"{parts[1]}_{variant}" if variant else parts[1]


def policy_name(cfg: DictConfig) -> str:
    """``<env>-<model>-seed<seed>``: the policy a run trains or a measurement plays."""
    return f"{env_name(cfg.env._target_)}-{cfg.model.get('name', 'model')}-seed{cfg.seed}"


def default_run_name(cfg: DictConfig) -> str:
    """``<credit>-<env>-<model>-seed<seed>``, from the config alone (works with Hydra's compose API too)."""
    credit = str(cfg.credit._target_).rsplit(".", 1)[-1].lower()
    return f"{credit}-{policy_name(cfg)}"


def run_name(cfg: DictConfig, kind: str = "train") -> str:
    """The run's name: its folder (``hydra.run.dir``), its MLflow run and ``cfg.run_name`` all come from here.

    ``run_name`` when one is given (two runs that differ only in an override, e.g. an ablation, need names of their
    own, or the second replaces the first's config, metrics and checkpoints). Else, ``kind="train"``:
    ``<credit>-<env>-<model>-seed<seed>``; ``kind="fidelity"``: ``fidelity-<env>-<model>-seed<seed>``, with
    ``-<run>-<checkpoint>`` when a checkpoint is measured (the warm start's and a trained policy's measurements get
    folders of their own).
    """
    if cfg.get("run_name"):
        return str(cfg.run_name)
    if kind == "train":
        return default_run_name(cfg)
    if kind != "fidelity":
        raise ValueError(f"run_name kind must be train or fidelity, got {kind!r}")
    name = f"fidelity-{policy_name(cfg)}"
    if cfg.get("ckpt_path"):
        path = Path(str(cfg.ckpt_path))
        name += f"-{path.parent.parent.name}-{path.stem}"
    return name


def _run_name_resolver(kind: str = "train", *, _root_: DictConfig) -> str:
    """``${progpo.run_name:}`` (``${progpo.run_name:fidelity}``): :func:`run_name` of the config it sits in."""
    return run_name(_root_, kind)


OmegaConf.register_new_resolver("progpo.run_name", _run_name_resolver, replace=True)


def resolve_run_dir(cfg: DictConfig) -> Path:
    """``run_dir`` if set, else Hydra's output dir when running under Hydra, else ``outputs/runs/<run_name>``."""
    if cfg.get("run_dir"):
        return Path(cfg.run_dir)
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path("outputs") / "runs" / run_name(cfg)


def find_resume_checkpoint(cfg: DictConfig, run_dir: Path) -> Path | None:
    """``ckpt_path`` wins; ``resume=true`` takes ``<run_dir>/checkpoints/last.ckpt`` when it exists."""
    if cfg.get("ckpt_path"):
        return existing_ckpt_path(cfg.ckpt_path)
    if cfg.get("resume"):
        path = run_dir / "checkpoints" / "last.ckpt"
        if path.is_file():
            return path
        log.warning("resume=true but %s does not exist: starting a new run", path)
    return None


def existing_ckpt_path(path: str | Path) -> Path:
    """``ckpt_path`` as a Path, or a :class:`ConfigError` naming it when there is no such file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"ckpt_path={path} does not exist; give an existing .ckpt file or drop ckpt_path")
    return path


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint on the CPU, memory-mapped; a truncated or corrupt file fails naming it."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # torch raises EOFError, RuntimeError, UnpicklingError... for a bad file
        raise ConfigError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {err}); it is empty or corrupt. Point "
            f"ckpt_path at an intact one (e.g. a periodic iter-XXXX.ckpt beside it) or drop resume=true"
        ) from None


def load_run_weights(run: Any, checkpoint: Path) -> None:
    """An RL checkpoint's weights into a built run (``progpo.train.build``), strictly as Lightning saved the module,
    and into its rollout engine, so a probe asks what RL made of the warm start (a checkpoint of another model fails
    loudly)."""
    run.module.load_state_dict(read_checkpoint(checkpoint)["state_dict"])
    run.engine.sync_weights(run.module.actor)


def stored_run_id(ckpt: Path | None) -> str | None:
    """The logger run id a checkpoint was written under (a resumed run continues that run)."""
    if ckpt is None:
        return None
    return read_checkpoint(ckpt).get("progpo", {}).get("logger_run_id")


def check_world_size(ckpt: Path | None, world_size: int) -> None:
    """A checkpoint resumes only with the world size that wrote it (older checkpoints: one process)."""
    if ckpt is not None:
        saved = int(read_checkpoint(ckpt).get("world_size", 1))
        if saved != world_size:
            raise ConfigError(f"{ckpt}: {world_size_mismatch(saved, world_size)}")


def save_or_compare_config(cfg: DictConfig, path: Path, resuming: bool) -> None:
    """A new run writes its resolved config; a resumed run keeps it and reports any difference."""
    current = OmegaConf.to_container(cfg, resolve=True)
    if resuming and path.is_file():
        saved = _flatten(OmegaConf.to_container(OmegaConf.load(path), resolve=True))
        now = _flatten(current)
        diff = sorted(k for k in set(saved) | set(now)
                      if k.split(".")[0] not in _RESUME_KEYS and saved.get(k) != now.get(k))
        if diff:
            log.warning("resumed with a config that differs from the checkpointed run in: %s", ", ".join(diff))
        else:
            log.info("resumed with the same config as the checkpointed run")
        return
    OmegaConf.save(OmegaConf.create(current), path)


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def quiet_lightning() -> None:
    """Lightning's start-up chatter (GPU/TPU availability, tips) and known-harmless warnings hide our own logs."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning", "lightning.pytorch.utilities.rank_zero",
                 "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for pattern in (".*LeafSpec.*", ".*transfer_batch_to_device.*", ".*weights_only.*", ".*in eval mode.*",
                    ".*does not have many workers.*", ".*IterableDataset.*",
                    # vLLM initialises torch.distributed (world size 1): Lightning then asks for sync_dist on every
                    # epoch-level self.log; the values logged there are this process's own.
                    ".*sync_dist=True.*"):
        warnings.filterwarnings("ignore", message=pattern)
