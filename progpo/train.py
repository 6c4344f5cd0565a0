"""`python -m progpo.train`: compose the config, validate it, build the parts, run RL, print a summary.

``train(cfg)`` is the library entry point (tests, sweeps); ``main()`` is the Hydra task function and returns the
metric named by ``cfg.objective`` so that a sweep can optimise it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from progpo.config import ConfigError, validate_config

log = logging.getLogger(__name__)


@dataclass
class TrainObjects:
    """What a run built, handed back to callers (tests, sweeps) together with the metrics."""

    module: Any
    trainer: Any
    datamodule: Any
    suite: Any
    policy: Any
    run_dir: Path


def build_with(node: DictConfig, **runtime: Any) -> Any:
    """Instantiate a ``_target_`` node with runtime objects (suite, policy, ...).

    The objects are passed to a partial rather than to ``instantiate``, which would turn dataclasses into configs.
    """
    from hydra.utils import instantiate

    return instantiate(node, _partial_=True)(**runtime)


def no_logger(cfg: DictConfig | None = None, run_id: str | None = None) -> None:
    """``logger=none``: metrics go to the terminal and the run's ``metrics.jsonl`` only."""
    return None


def default_run_name(cfg: DictConfig) -> str:
    """<credit>-<env>-<model>-seed<seed>, from the config alone (works with Hydra's compose API too)."""
    credit = str(cfg.credit._target_).rsplit(".", 1)[-1].lower()
    env = str(cfg.env._target_).split(".")[1] if str(cfg.env._target_).count(".") >= 2 else "env"
    model = str(cfg.model.get("name", "model"))
    return f"{credit}-{env}-{model}-seed{cfg.seed}"


def resolve_run_dir(cfg: DictConfig) -> Path:
    """``run_dir`` if set, else Hydra's output dir when running under Hydra, else ``outputs/runs/<run_name>``."""
    if cfg.get("run_dir"):
        return Path(cfg.run_dir)
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path("outputs") / "runs" / (cfg.get("run_name") or default_run_name(cfg))


def find_resume_checkpoint(cfg: DictConfig, run_dir: Path) -> Path | None:
    """``ckpt_path`` wins; ``resume=true`` takes ``<run_dir>/checkpoints/last.ckpt`` when it exists."""
    if cfg.get("ckpt_path"):
        path = Path(cfg.ckpt_path)
        if not path.is_file():
            raise ConfigError(f"ckpt_path={path} does not exist; give an existing .ckpt file or drop ckpt_path")
        return path
    if cfg.get("resume"):
        path = run_dir / "checkpoints" / "last.ckpt"
        if path.is_file():
            return path
        log.warning("resume=true but %s does not exist: starting a new run", path)
    return None


_RESUME_KEYS = ("resume", "ckpt_path")


def _save_or_compare_config(cfg: DictConfig, path: Path, resuming: bool) -> None:
    """A new run writes its resolved config; a resumed run keeps it and reports any difference."""
    current = OmegaConf.to_container(cfg, resolve=True)
    if resuming and path.is_file():
        saved = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        diff = sorted(k for k in set(_flatten(saved)) | set(_flatten(current))
                      if k.split(".")[0] not in _RESUME_KEYS and _flatten(saved).get(k) != _flatten(current).get(k))
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


def _stored_run_id(ckpt: Path | None) -> str | None:
    if ckpt is None:
        return None
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    return state.get("progpo", {}).get("logger_run_id")


def _quiet_lightning() -> None:
    """Lightning's start-up chatter (GPU/TPU availability, tips) and known-harmless warnings hide our own logs."""
    import warnings

    for name in ("lightning.pytorch", "lightning.fabric", "lightning", "lightning.pytorch.utilities.rank_zero",
                 "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for pattern in (".*LeafSpec.*", ".*transfer_batch_to_device.*", ".*weights_only.*", ".*in eval mode.*",
                    ".*does not have many workers.*", ".*IterableDataset.*"):
        warnings.filterwarnings("ignore", message=pattern)


def train(cfg: DictConfig, callbacks: list | None = None) -> tuple[dict[str, float], TrainObjects]:
    """Run RL training as configured; return the final metrics and the objects built."""
    typed = validate_config(cfg)  # fails fast, before any model or environment is built
    _quiet_lightning()

    import lightning as L
    import torch
    from hydra.utils import instantiate

    from envs.pool import EnvPool
    from progpo.callbacks import IterationCheckpoint, IterationProgressBar, MetricsFile, TrajectoryTable
    from progpo.models import make_reference
    from progpo.module import ProGPOModule
    from progpo.rollout.collector import RolloutCollector
    from progpo.rollout.datamodule import RolloutDataModule
    from progpo.rollout.prompt import PromptBuilder
    from progpo.summary import summary_table

    run_dir = resolve_run_dir(cfg)
    with open_dict(cfg):
        cfg.run_dir = str(run_dir)
        cfg.run_name = cfg.get("run_name") or default_run_name(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    if typed.trainer.num_threads:
        torch.set_num_threads(typed.trainer.num_threads)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    ckpt = find_resume_checkpoint(cfg, run_dir)
    _save_or_compare_config(cfg, run_dir / "config.yaml", resuming=ckpt is not None)

    device = "cuda" if typed.trainer.accelerator in ("gpu", "cuda") else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.accelerator=gpu but CUDA is not available; use trainer=cpu on this machine")

    log.info("building environment suite (%s)", cfg.env._target_)
    suite = instantiate(cfg.env)
    log.info("env %s: %d train tasks, %d held-out tasks (fingerprint %s)", suite.name, len(suite.train_tasks),
             len(suite.eval_tasks), suite.eval_fingerprint)
    policy = build_with(cfg.model, suite=suite, device=device)
    reference = make_reference(policy) if typed.trainer.kl_coef > 0 else None
    credit = instantiate(cfg.credit)
    engine = build_with(cfg.rollout.engine, policy=policy)
    max_new = int(cfg.rollout.engine.get("max_new_tokens", 32))
    max_prompt = typed.rollout.max_prompt_tokens or (policy.max_context - max_new)
    prompt_builder = PromptBuilder(
        policy.tokenizer, history=typed.rollout.history, max_prompt_tokens=max_prompt, style=policy.prompt_style
    )

    def pool_factory(num_envs: int) -> EnvPool:
        workers = min(typed.rollout.num_workers, num_envs)
        return EnvPool(suite.env_factory, num_envs, workers, step_timeout=typed.rollout.step_timeout)

    collector = RolloutCollector(suite, engine, prompt_builder, pool_factory)
    datamodule = RolloutDataModule(
        collector, suite, typed.rollout.tasks_per_batch, typed.rollout.group_size, cfg.seed,
        eval_temperature=typed.trainer.val_temperature,
    )
    module = ProGPOModule(policy, reference, credit, typed.trainer)

    run_id = _stored_run_id(ckpt)
    with open_dict(cfg):
        if run_id and "run_id" in cfg.logger:
            cfg.logger.run_id = run_id
    logger = build_with(cfg.logger, cfg=cfg)
    module.logger_run_id = getattr(logger, "run_id", None) if logger is not None else None

    all_callbacks = [
        IterationProgressBar(typed.trainer.max_iterations),
        IterationCheckpoint(run_dir / "checkpoints", every=typed.trainer.ckpt_every),
        MetricsFile(run_dir / "metrics.jsonl"),
        TrajectoryTable(typed.trainer.log_trajectories_every),
        *(callbacks or []),
    ]
    trainer = L.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=typed.trainer.devices,
        precision=typed.trainer.precision if device == "cuda" else "32-true",
        max_epochs=typed.trainer.max_iterations,
        check_val_every_n_epoch=typed.trainer.val_every,
        num_sanity_val_steps=0,
        logger=logger if logger is not None else False,
        callbacks=all_callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(run_dir),
        log_every_n_steps=1,
        reload_dataloaders_every_n_epochs=0,
    )
    try:
        if ckpt is None:
            trainer.validate(module, datamodule=datamodule, verbose=False)  # the warm-started start point
        else:
            log.info("resuming from %s", ckpt)
        # Our own checkpoints hold RNG states (numpy arrays), which torch's weights-only loader refuses.
        trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt) if ckpt else None, weights_only=False)
        if module.last_val_iteration != module.iterations_done:
            trainer.validate(module, datamodule=datamodule, verbose=False)
    finally:
        collector.close()
        engine.close()

    metrics = final_metrics(module)
    table = summary_table(module.initial_eval or {}, module.last_eval or {}, suite.task_types)
    sampling = "greedy" if typed.trainer.val_temperature == 0 else f"sampled at T={typed.trainer.val_temperature:g}"
    log.info("summary (held-out success, %s; start vs end):\n%s", sampling, table)
    (run_dir / "summary.md").write_text(table + "\n")
    _plot_curves(module.history, run_dir, logger)
    if logger is not None and hasattr(logger, "end_run"):
        logger.end_run("FINISHED")  # only now: Lightning's finalize("success") after each validate/fit does not end it
    return metrics, TrainObjects(module, trainer, datamodule, suite, policy, run_dir)


def _plot_curves(history: list[dict[str, float]], run_dir: Path, logger: Any) -> None:
    """Train and held-out success vs iteration, and the credit diagnostics, as ``curves.png`` in the run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from progpo.tracking import log_figure

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for key, style in (("train/success", "-"), ("val/success", "o-")):
        points = [(row["step"], row[key]) for row in history if key in row]
        if points:
            axes[0].plot(*zip(*points), style, label=key)
    axes[0].set(xlabel="iteration", ylabel="success rate", ylim=(-0.02, 1.02), title="success")
    axes[0].legend()
    for key in ("credit/peer_zero", "credit/transition_active", "credit/transition_only", "credit/still_zero"):
        points = [(row["step"], row[key]) for row in history if key in row]
        if points:
            axes[1].plot(*zip(*points), label=key.split("/", 1)[1])
    axes[1].set(xlabel="iteration", ylabel="share of steps", ylim=(-0.02, 1.02), title="credit diagnostics")
    if axes[1].lines:
        axes[1].legend()
    fig.tight_layout()
    fig.savefig(run_dir / "curves.png", dpi=100)
    if logger is not None:
        log_figure(logger, fig, "curves")
    plt.close(fig)


def final_metrics(module) -> dict[str, float]:
    """Last value of every metric, plus the start-of-run evaluation under ``start/``."""
    out: dict[str, float] = {}
    for row in module.history:
        out.update({k: v for k, v in row.items() if k != "step"})
    for key, value in (module.initial_eval or {}).items():
        out[key.replace("val/", "start/", 1)] = value
    out["iterations"] = float(module.iterations_done)
    return out


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        metrics, _ = train(cfg)
    except ConfigError as err:
        log.error("invalid configuration: %s", err)
        raise SystemExit(2) from None
    return metrics.get(cfg.objective)


if __name__ == "__main__":
    main()
