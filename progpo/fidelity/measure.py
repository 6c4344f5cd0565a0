"""One fidelity measurement, top to bottom: collect a batch as training would, let every estimator score it,
measure the Monte-Carlo truth of a stratified sample of its steps, compare.

``measure(cfg)`` is the library entry point (``python -m progpo.fidelity`` calls it); ``score_truth`` re-scores a
saved truth file with any estimators in milliseconds (the fidelity sweep's objective).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf, open_dict

from envs.base import is_replayable
from progpo.config import ConfigError
from progpo.credit import StepBatch
from progpo.fidelity.config import FidelityConfig, build_estimators
from progpo.fidelity.scoring import METRICS, Scores, metric_rows, noise_floor, score
from progpo.fidelity.selection import SLICES, step_features, stratified_sample
from progpo.fidelity.truth import FidelityTruth, measure_truth
from progpo.runs import resolve_run_dir, run_name

log = logging.getLogger(__name__)


@dataclass
class FidelityResult:
    """A measurement's numbers: the truth, every estimator's advantages on the measured steps, the scores overall
    and per slice, the noise floor, and where the time went."""

    truth: FidelityTruth
    estimates: dict[str, np.ndarray]  # estimator -> A_est on the measured steps
    scores: Scores
    slices: dict[str, Scores]
    floor: dict[str, float]
    timing: dict[str, float] = field(default_factory=dict)


def score_truth(truth: FidelityTruth, estimators: dict[str, Any], bootstrap: int = 1000, seed: int = 0
                ) -> FidelityResult:
    """Every estimator on the truth's batch, scored against its measured steps (overall and per slice)."""
    batch = truth.step_batch()
    estimates = {name: truth.estimates(est, batch) for name, est in estimators.items()}
    a_hat, se = truth.a_hat, truth.se
    features = step_features(batch, {int(j): bool(w) for j, w in zip(truth.traj, truth.won)})
    slices = {}
    for name, feature, value in SLICES:
        mask = features[feature][truth.steps] == value
        if mask.sum() >= 3:
            slices[name] = score({k: v[mask] for k, v in estimates.items()}, a_hat[mask], se[mask], bootstrap, seed)
    return FidelityResult(truth, estimates, score(estimates, a_hat, se, bootstrap, seed), slices,
                          noise_floor(a_hat, se, seed=seed))


def point_metrics(truth: FidelityTruth, estimator: Any, batch: StepBatch | None = None) -> dict[str, float]:
    """One estimator's metrics on the truth's measured steps, without intervals: a sweep trial's objective
    (milliseconds). ``batch``: ``truth.step_batch()`` built once by a caller that scores many estimators."""
    rows = metric_rows(truth.estimates(estimator, batch), truth.a_hat, truth.se)
    return {m: float(rows[m]) for m in METRICS}


def take_fidelity_config(cfg: DictConfig) -> FidelityConfig:
    """Check ``cfg.fidelity`` and the run's own keys, then remove ``fidelity`` from ``cfg`` (the run is built from
    the rest, exactly as ``progpo.train`` builds it). Fails before anything is built."""
    if "fidelity" not in cfg:
        raise ConfigError("no fidelity settings: run python -m progpo.fidelity (conf/fidelity.yaml)")
    spec = FidelityConfig.from_node(cfg.fidelity)
    build_estimators(spec.estimators, cfg)  # a bad estimator parameter fails here
    if spec.truth is None:
        if not is_replayable(get_object(cfg.env._target_)):
            raise ConfigError(f"env {cfg.env._target_} is not deterministic (its episodes cannot be restored by "
                              f"replaying their actions), so its advantages cannot be measured by Monte Carlo; "
                              f"use env=alfworld or env=webshop (the offline shop)")
        most = int(cfg.rollout.tasks_per_batch) * int(cfg.rollout.group_size) * int(cfg.env.max_steps)
        if spec.steps > most:
            raise ConfigError(f"fidelity.steps={spec.steps} is more than a batch can hold (rollout.tasks_per_batch x "
                              f"rollout.group_size x env.max_steps = {most}); use fewer, e.g. fidelity.steps=200")
    if cfg.get("resume"):
        raise ConfigError("resume=true: progpo.fidelity resumes nothing; give the policy to measure as "
                          "ckpt_path=outputs/runs/<run>/checkpoints/last.ckpt")
    with open_dict(cfg):
        del cfg["fidelity"]
    return spec


def measure(cfg: DictConfig) -> FidelityResult:
    """Measure the configured policy's batch (or re-score ``fidelity.truth``); write and log the results."""
    from progpo.fidelity.outputs import write_outputs
    from progpo.train import build

    spec = take_fidelity_config(cfg)
    _name_run(cfg)
    if spec.truth is not None:
        truth = FidelityTruth.load(spec.truth)
        result = score_truth(truth, build_estimators(spec.estimators, cfg), spec.bootstrap, spec.seed)
        # beside the truth, not over the measurement's own tables (they may score other estimators)
        write_outputs(result, Path(cfg.get("run_dir") or Path(spec.truth).parent / "rescored"), logger=None)
        return result
    checkpoint = _checkpoint_to_measure(cfg)
    run = build(cfg)
    from progpo.runs import load_run_weights, read_checkpoint
    from progpo.tracking import run_status

    with run_status(run.logger):
        try:
            iteration = spec.iteration
            if checkpoint is not None:
                load_run_weights(run, checkpoint)
                done = _iterations_done(read_checkpoint(checkpoint))
                iteration = done if iteration is None else iteration
                log.info("measuring the policy of %s", checkpoint)
            result = _measure_built(run, spec, iteration or 0, checkpoint)
        finally:
            run.collector.close()
            run.engine.close()
        write_outputs(result, run.run_dir, run.logger)
    return result


def _measure_built(run, spec: FidelityConfig, iteration: int, checkpoint: Path | None) -> FidelityResult:
    import torch

    from progpo.hardware import machine_label
    from progpo.lit.datamodule import sample_tasks

    tasks = sample_tasks(run.suite.train_tasks, run.typed.rollout.tasks_per_batch, int(run.cfg.seed), iteration)
    rl = run.module.rl
    timing: dict[str, float] = {}
    with run.trainer.precision_plugin.train_step_context():  # the autocast training samples and scores under
        started = time.perf_counter()
        batch = run.collector.collect(tasks, rl.group_size)
        timing["collect_s"] = time.perf_counter() - started
        _scored, steps = rl.score(batch)
        if spec.steps > steps.n:
            raise ConfigError(f"fidelity.steps={spec.steps} is more than this batch's {steps.n} steps; use fewer")
        won = {e.traj: e.won for e in batch.episodes}
        chosen = stratified_sample(step_features(steps, won), spec.steps, spec.seed)
        torch.manual_seed(spec.seed)
        complement = _uses_complement(spec.truth_estimator, run.engine)
        started = time.perf_counter()
        played = measure_truth(run.collector, batch.turns, batch.episodes, chosen, spec.continuations, spec.gamma,
                               spec.chunk, complement)
        timing["continuations_s"] = time.perf_counter() - started
    spent = played.timing
    timing.update(replay_s=spent.replay_seconds, generate_s=spent.generate_seconds, env_s=spent.env_seconds,
                  replay_steps=spent.replay_steps, env_steps=spent.env_steps, episodes=spent.episodes,
                  generated_tokens=spent.generated_tokens)
    truth = FidelityTruth.measured(steps, won, chosen, played, meta={
        "env": run.suite.name, "model": run.policy.name, "seed": int(run.cfg.seed), "iteration": iteration,
        "checkpoint": str(checkpoint) if checkpoint else None, "gamma": spec.gamma,
        "continuations": spec.continuations, "steps_requested": spec.steps,
        "truth_estimator": "complement" if complement else "sampled",
        "batch_steps": steps.n, "tasks_per_batch": len(tasks), "group_size": rl.group_size,
        "batch_success": float(np.mean([e.won for e in batch.episodes])), "machine": machine_label(),
        "timing": timing,
    })
    truth.save(spec.save or run.run_dir / "truth.npz")
    started = time.perf_counter()
    result = score_truth(truth, build_estimators(spec.estimators, run.cfg), spec.bootstrap, spec.seed)
    timing["scoring_s"] = time.perf_counter() - started
    result.timing = timing
    return result


def _name_run(cfg: DictConfig) -> None:
    """Name the run and its folder (``outputs/fidelity/<name>``, the Hydra run dir of ``conf/fidelity.yaml``), and
    tag the logger's run ``progpo.kind=fidelity`` so reports tell it from training runs."""
    from hydra.core.hydra_config import HydraConfig

    from progpo.tracking.mlflow_logger import KIND_TAG

    with open_dict(cfg):
        if not cfg.get("run_dir") and not HydraConfig.initialized():
            cfg.run_dir = str(Path("outputs") / "fidelity" / run_name(cfg, "fidelity"))
        if not cfg.get("run_name"):
            cfg.run_name = resolve_run_dir(cfg).name
        if "tags" in cfg.logger:
            cfg.logger.tags = {**OmegaConf.to_container(cfg.logger.tags), KIND_TAG: "fidelity"}


def _uses_complement(choice: str, engine: Any) -> bool:
    """``fidelity.truth_estimator``: ``complement`` needs the exact probability of an action, which an engine has
    when it decodes only admissible commands and nothing before them (``truth`` explains both estimators)."""
    exact = bool(getattr(engine, "constrain_to_admissible", False)) and not getattr(engine, "reasoning_tokens", 0)
    if choice == "complement" and not exact:
        raise ConfigError("fidelity.truth_estimator=complement needs an engine that decodes only admissible commands "
                          "(rollout.engine.constrain_to_admissible=true, reasoning_tokens=0): with free decoding a "
                          "response's probability is not its action's. Use fidelity.truth_estimator=sampled (or auto)")
    return exact if choice == "auto" else choice == "complement"


def _checkpoint_to_measure(cfg: DictConfig) -> Path | None:
    """Take ``ckpt_path`` out of ``cfg`` (``build`` would resume from it) after checking it can be read."""
    from progpo.runs import existing_ckpt_path, read_checkpoint

    if not cfg.get("ckpt_path"):
        return None
    checkpoint = existing_ckpt_path(cfg.ckpt_path)
    read_checkpoint(checkpoint)
    with open_dict(cfg):
        cfg.ckpt_path = None
    return checkpoint


def _iterations_done(checkpoint: dict[str, Any]) -> int:
    """RL iterations a checkpoint has done (the DataModule's counter): the batch it would collect next is that
    iteration's."""
    return int(checkpoint.get("RolloutDataModule", {}).get("iterations_done", checkpoint.get("epoch", -1) + 1))
