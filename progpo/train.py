"""`python -m progpo.train`: compose the config, validate it, build the parts, run RL, print a summary.

``build(cfg)`` instantiates everything a run needs (logger first, so a bad tracking store fails before anything
slow is built); ``fit(run)`` evaluates the start point, trains, evaluates the end point and writes the summary;
``train(cfg)`` does both and is the library entry point (tests, sweeps). ``main()`` is the Hydra task function
and returns the metric named by ``cfg.objective`` so that a sweep can optimise it. One iteration's data flow is in
``progpo/algo/iteration.py``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, open_dict

from progpo import dist
from progpo.config import ConfigError, RunConfig, preflight_model, validate_config
from progpo.hardware import auto_batch_rows, cpu_has_fast_bf16, machine_label, resolve_precision
from progpo.runs import (
    check_world_size,
    find_resume_checkpoint,
    quiet_lightning,
    resolve_run_dir,
    run_name,
    save_or_compare_config,
    stored_run_id,
)

log = logging.getLogger(__name__)


@dataclass
class Run:
    """What ``build`` made, handed to ``fit`` and back to callers (tests, sweeps)."""

    cfg: DictConfig
    typed: RunConfig
    run_dir: Path
    ckpt: Path | None
    logger: Any
    suite: Any
    policy: Any
    engine: Any
    collector: Any
    module: Any
    datamodule: Any
    record: Any
    trainer: Any
    started: float = 0.0  # time.perf_counter() when build began
    build_s: float = 0.0


def build_with(node: DictConfig, **runtime: Any) -> Any:
    """Instantiate a ``_target_`` node with runtime objects (suite, policy, ...).

    The objects are passed to a partial rather than to ``instantiate``, which would turn dataclasses into configs.
    """
    from hydra.utils import instantiate

    return instantiate(node, _partial_=True)(**runtime)


def no_logger(cfg: DictConfig | None = None, run_id: str | None = None, experiment_name: str | None = None) -> None:
    """``logger=none``: metrics go to the terminal and the run's ``metrics.jsonl`` only. ``experiment_name`` is
    accepted and unused: experiment files name their MLflow experiment, and ``experiment=... logger=none`` must
    still compose."""
    return None


def _prepare(cfg: DictConfig) -> tuple[RunConfig, Path, Path | None, str | None]:
    """Validate, name the run, check its checkpoint, seed: everything before the first slow object.

    Every bad input (config, missing or unreadable checkpoint, GPU asked for without CUDA) fails here with a
    :class:`ConfigError`, before anything is built or written.
    """
    typed = validate_config(cfg)  # fails fast, before any model or environment is built
    preflight_model(cfg.model)  # missing weights: seconds, not a minute of hub retries after the env is built
    quiet_lightning()
    run_dir = resolve_run_dir(cfg)
    with open_dict(cfg):
        cfg.run_dir = str(run_dir)
        cfg.run_name = run_name(cfg)  # the MLflow run is named as the folder (hydra.run.dir) is
    ckpt = find_resume_checkpoint(cfg, run_dir)
    run_id = stored_run_id(ckpt)  # reads the checkpoint: an empty or corrupt one fails here, naming the file
    check_world_size(ckpt, typed.trainer.world_size)
    import lightning as L
    import torch

    if typed.trainer.uses_cuda and not torch.cuda.is_available():
        raise ConfigError("trainer.accelerator=gpu but CUDA is not available; use trainer=cpu on this machine")
    float32_sampler = _samples_in_float32(cfg, typed)
    if typed.trainer.precision == "auto":
        typed.trainer.precision = resolve_precision("auto", typed.trainer.uses_cuda, float32_sampler)
        log.info("trainer.precision=auto: %s on this machine (%s)", typed.trainer.precision, machine_label())
    if typed.ppo.micro_batch_size == "auto":
        typed.ppo.micro_batch_size = auto_batch_rows(typed.trainer.precision, typed.trainer.uses_cuda)
        log.info("ppo.micro_batch_size=auto: %d on this machine", typed.ppo.micro_batch_size)
    if typed.trainer.precision.startswith("bf16") and not typed.trainer.uses_cuda and cpu_has_fast_bf16() is False:
        log.warning("trainer.precision=%s on a CPU without AMX-BF16 or AVX512-BF16: bf16 matmuls are emulated here "
                    "and slower than float32 (python -m progpo.bench iteration measures both); trainer.precision=32-true "
                    "is faster on this machine", typed.trainer.precision)
    if typed.trainer.precision.startswith("bf16") and float32_sampler:
        log.warning("trainer.precision=%s with rollout=vllm on a CPU: vLLM samples in float32 here, so the trainer's "
                    "log-probs differ from the sampler's (~0.04 nats a token measured); trainer.precision=auto or "
                    "32-true scores the policy that sampled", typed.trainer.precision)
    if dist.is_primary():  # the other ranks of a distributed run write nothing of their own
        run_dir.mkdir(parents=True, exist_ok=True)
    if typed.torch_threads:
        torch.set_num_threads(typed.torch_threads)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    if dist.is_primary():
        save_or_compare_config(cfg, run_dir / "config.yaml", resuming=ckpt is not None)
    return typed, run_dir, ckpt, run_id


def _samples_in_float32(cfg: DictConfig, typed: RunConfig) -> bool:
    """Whether the engine samples in float32 whatever the trainer autocasts: an engine that declares it samples in
    the actor's weight dtype (``samples_in_weight_dtype``, vLLM), on a CPU, where the actors' weights are float32."""
    from hydra.utils import get_object

    engine = get_object(cfg.rollout.engine._target_)  # validate_config has imported it already
    return not typed.trainer.uses_cuda and getattr(engine, "samples_in_weight_dtype", False)


def _build_rollout(cfg: DictConfig, typed: RunConfig, suite, policy) -> tuple[Any, Any]:
    """The engine and the collector that drives it and the env pools."""
    from envs.pool import EnvPool
    from progpo.rollout.collector import RolloutCollector
    from progpo.rollout.prompt import PromptBuilder

    engine = build_with(cfg.rollout.engine, policy=policy)
    max_prompt = typed.rollout.max_prompt_tokens or (policy.max_context - engine.max_new_tokens)
    prompts = PromptBuilder(policy.tokenizer, history=typed.rollout.history, max_prompt_tokens=max_prompt,
                            style=policy.prompt_style)

    def pool_factory(num_envs: int) -> EnvPool:
        workers = min(typed.rollout.num_workers, num_envs)
        return EnvPool(suite.env_factory, num_envs, workers, step_timeout=typed.rollout.step_timeout)

    return engine, RolloutCollector(suite, engine, prompts, pool_factory)


def build(cfg: DictConfig, callbacks: list | None = None) -> Run:
    """Everything one run needs, built in the order that fails fastest; nothing is trained yet."""
    started = time.perf_counter()
    typed, run_dir, ckpt, run_id = _prepare(cfg)
    with open_dict(cfg):
        if run_id and "run_id" in cfg.logger:
            cfg.logger.run_id = run_id
    # Checks the tracking store before anything slow is built. Only rank 0 tracks (metrics are reduced over ranks).
    logger = build_with(cfg.logger, cfg=cfg) if dist.is_primary() else None
    try:
        run = _build_parts(cfg, typed, run_dir, ckpt, logger, callbacks or [])
    except BaseException as error:
        if hasattr(logger, "end_run"):
            logger.end_run("FAILED", error)
        raise
    run.started, run.build_s = started, time.perf_counter() - started
    return run


def _build_parts(cfg: DictConfig, typed: RunConfig, run_dir: Path, ckpt: Path | None, logger, callbacks: list) -> Run:
    """The env suite, the policy, the rollout, the iteration, the Lightning objects."""
    import lightning as L
    from hydra.utils import instantiate

    from progpo.algo import RLIteration
    from progpo.algo.scoring import pad_token_id
    from progpo.lit.callbacks import (
        AtomicCheckpointIO,
        IterationCheckpoint,
        IterationProgressBar,
        RunRecord,
        TrajectoryTable,
    )
    from progpo.lit.datamodule import RolloutDataModule
    from progpo.lit.module import ProGPOModule
    from progpo.models import make_reference

    log.info("building environment suite (%s)", cfg.env._target_)
    suite = instantiate(cfg.env)
    log.info("env %s: %d train tasks, %d held-out tasks (fingerprint %s)", suite.name, len(suite.train_tasks),
             len(suite.eval_tasks), suite.eval_fingerprint)
    policy = build_with(cfg.model, suite=suite, device="cuda" if typed.trainer.uses_cuda else "cpu")
    engine, collector = _build_rollout(cfg, typed, suite, policy)
    rl = RLIteration(
        collector, engine, instantiate(cfg.credit), policy.model,
        make_reference(policy) if typed.ppo.kl_coef > 0 else None, typed.ppo, pad_token_id(policy.tokenizer),
        typed.rollout.group_size, typed.eval.temperature, cfg.seed, typed.eval.episodes_per_task,
    )
    module = ProGPOModule(rl, optimizer=instantiate(cfg.optim))
    datamodule = RolloutDataModule(suite, typed.rollout.tasks_per_batch, cfg.seed)
    record = RunRecord(run_dir / "metrics.jsonl")
    trainer = L.Trainer(
        **vars(typed.trainer),
        max_epochs=typed.schedule.max_iterations,
        check_val_every_n_epoch=typed.eval.every,
        num_sanity_val_steps=0,
        logger=logger if logger is not None else False,
        callbacks=[record, IterationProgressBar(typed.schedule.max_iterations),
                   IterationCheckpoint(run_dir / "checkpoints", every=typed.schedule.ckpt_every),
                   TrajectoryTable(typed.schedule.log_trajectories_every, policy.tokenizer), *callbacks],
        enable_checkpointing=False,
        plugins=[AtomicCheckpointIO()],
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(run_dir),
        log_every_n_steps=1,
    )
    return Run(cfg, typed, run_dir, ckpt, logger, suite, policy, engine, collector, module, datamodule, record,
               trainer)


def fit(run: Run) -> dict[str, float]:
    """Evaluate the start point, train, evaluate the end point; write the summary and curves."""
    from progpo.lit.plots import plot_curves
    from progpo.summary import summary_table, time_table
    from progpo.tracking import run_status

    trainer, module, datamodule, record = run.trainer, run.module, run.datamodule, run.record
    # The MLflow run ends FINISHED only after the final evaluation; FAILED if anything raises, KILLED on Ctrl+C.
    with run_status(run.logger):
        try:
            if run.ckpt is None:
                trainer.validate(module, datamodule=datamodule, verbose=False)  # the warm-started start point
            else:
                log.info("resuming from %s", run.ckpt)
            # Our own checkpoints hold RNG states (numpy arrays), which torch's weights-only loader refuses.
            trainer.fit(module, datamodule=datamodule, ckpt_path=str(run.ckpt) if run.ckpt else None,
                        weights_only=False)
            if record.last_eval_iteration != record.iterations_done:
                trainer.validate(module, datamodule=datamodule, verbose=False)
        finally:
            run.collector.close()
            run.engine.close()
        if trainer.is_global_zero:
            table = summary_table(record.initial_eval or {}, record.last_eval or {}, run.suite.task_types)
            temperature = run.typed.eval.temperature
            per_task = run.typed.eval.episodes_per_task
            sampling = "greedy" if temperature == 0 else f"sampled at T={temperature:g}"
            sampling += f", {per_task} episodes per task" if per_task > 1 else ""
            log.info("summary (held-out success, %s; start vs end):\n%s", sampling, table)
            plot_curves(record.history, run.run_dir, run.logger)
            timing = time_table(record.rows_this_process(), run.build_s, time.perf_counter() - run.started)
            log.info("where this process's time went:\n%s", timing)
            (run.run_dir / "summary.md").write_text(f"{table}\n\n{timing}\n")
    return record.final_metrics()


def train(cfg: DictConfig, callbacks: list | None = None) -> tuple[dict[str, float], Run]:
    """Run RL training as configured; return the final metrics and the objects built."""
    run = build(cfg, callbacks)
    return fit(run), run


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        metrics, _ = train(cfg)
    except ConfigError as err:  # includes an unusable tracking store (TrackingUnavailableError)
        log.error("invalid configuration: %s", err)
        raise SystemExit(2) from None
    return metrics.get(cfg.objective)


if __name__ == "__main__":
    main()
