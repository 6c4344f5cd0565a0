"""Reading the runs of an MLflow experiment: training runs (``load_runs``, ``RunRecord``), credit-fidelity
measurements (``load_fidelity_runs``, ``FidelityRecord``), run status, left-out runs."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from progpo.credit.result import DIAGNOSTIC_STATS
from progpo.tracking.mlflow_logger import KIND_TAG
from progpo.tracking.run_info import MACHINE_TAG, PROCESS_TAG, process_is_gone

log = logging.getLogger(__package__)

METHOD_ORDER = ("grpo", "gigpo", "hgpo", "progpo")
ABLATION_ORDER = ("plain", "semantic", "fusion", "full")
CREDIT_KEYS = DIAGNOSTIC_STATS
SCORE_KEYS = ("train/score", "val/score")  # WebShop's purchase score, logged beside success
OPTION_KEYS = ("val/option_match",)  # WebShop: share of the goal's options a held-out purchase got right
CURVE_KEYS = ("train/success", "val/success", *SCORE_KEYS, *OPTION_KEYS, *(f"credit/{k}" for k in CREDIT_KEYS))


@dataclass
class RunRecord:
    """One training run as the report sees it."""

    run_id: str
    method: str
    env: str
    seed: str
    ablation: str | None
    status: str
    final: dict[str, float]  # latest value of every metric
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # step-sorted, for CURVE_KEYS
    variant: str | None = None  # Table 3's variant: the `ablation` tag, else what a ProGPO run's credit config is
    group: str | None = None  # the `group` tag: the multirun or study the run belongs to
    machine: str | None = None  # the `machine` tag (``progpo.hardware.machine_label``); None for older runs

    @property
    def label(self) -> str:
        return f"{self.method}[{self.ablation}]" if self.ablation else self.method


def _sort_key(label: str) -> tuple[int, int, str]:
    method, _, rest = label.partition("[")
    ablation = rest.rstrip("]")
    m = METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)
    a = ABLATION_ORDER.index(ablation) if ablation in ABLATION_ORDER else (-1 if not ablation else len(ABLATION_ORDER))
    return m, a, label


def transition_variant(params: Mapping[str, str]) -> str | None:
    """Which of Table 3's variants (``conf/ablation/``) a ProGPO run's logged credit config is: semantic expansion
    is on when ``credit.min_value_group`` > 0, reliability fusion when ``credit.fusion`` is ``inverse_variance``.
    So a ``compare_methods`` ProGPO run at the paper defaults is the ``full`` variant, with no need to train it
    twice. None when the params are not logged."""
    try:
        semantic = int(params["credit.min_value_group"]) > 0
        fusion = params["credit.fusion"] == "inverse_variance"
    except (KeyError, ValueError):
        return None
    return {(False, False): "plain", (True, False): "semantic", (False, True): "fusion", (True, True): "full"}[
        (semantic, fusion)]


TRAIN_KINDS = (None, "", "train")  # ``progpo.kind`` of a training run (None: logged before the tag existed)
FIDELITY_KIND = "fidelity"  # ``progpo.kind`` of a ``python -m progpo.fidelity`` measurement
WARM_START_POLICY = "as built"  # ``fidelity.policy`` of a measurement of the warm start (else a checkpoint path)


@dataclass
class FidelityRecord:
    """One credit-fidelity measurement (``python -m progpo.fidelity``) as the report sees it: its tags and its
    ``fidelity/*`` metrics (``fidelity/<estimator>/<metric>`` with ``_low``/``_high``, ``fidelity/noise_floor/*``,
    ``fidelity/steps``), logged once at step 0."""

    run_id: str
    status: str
    tags: dict[str, str]  # every tag but MLflow's own (``mlflow.*``) and the logging process
    metrics: dict[str, float]  # the ``fidelity/*`` metrics
    start_time: int = 0  # ms since the epoch: of a seed measured twice at one policy, the latest counts

    @property
    def env(self) -> str:
        return self.tags.get("env", "unknown")

    @property
    def seed(self) -> str:
        return self.tags.get("seed", "?")

    @property
    def group(self) -> str | None:
        return self.tags.get("group")

    @property
    def machine(self) -> str | None:
        return self.tags.get(MACHINE_TAG)

    @property
    def policy(self) -> str:
        """``fidelity.policy``: ``as built`` (the warm start) or the checkpoint measured."""
        return self.tags.get("fidelity.policy", "?")

    @property
    def warm_start(self) -> bool:
        return self.policy == WARM_START_POLICY

    @property
    def iteration(self) -> int | None:
        """``fidelity.iteration``: RL iterations the measured policy has done (0: the warm start); None if absent."""
        try:
            return int(self.tags["fidelity.iteration"])
        except (KeyError, ValueError):
            return None

    @property
    def estimators(self) -> list[str]:
        """The estimators this run scored (those with a ``fidelity/<estimator>/spearman`` metric)."""
        return sorted({key.split("/")[1] for key in self.metrics
                       if key.count("/") == 2 and key.endswith("/spearman") and key.split("/")[1] != "noise_floor"})

    def value(self, estimator: str, metric: str, bound: str = "") -> float:
        """``fidelity/<estimator>/<metric>[_low|_high]``; NaN when not logged (e.g. no step with a known sign)."""
        return self.metrics.get(f"fidelity/{estimator}/{metric}{bound}", float("nan"))


LEFT_OUT_WHY = {
    "RUNNING": "still training, or killed on another host",
    "KILLED": "killed or pruned; a killed run continues with resume=true",
    "FAILED": "raised an error",
    "SCHEDULED": "never started",
}


def describe_left_out(left_out: dict[str, int]) -> str:
    """'left out 3 runs that did not finish: 2 KILLED (killed or pruned; ...), 1 RUNNING (...)'."""
    if not left_out:
        return "left out no runs"
    parts = ", ".join(f"{n} {status} ({LEFT_OUT_WHY.get(status, 'not finished')})"
                      for status, n in sorted(left_out.items(), key=lambda item: -item[1]))
    return f"left out {sum(left_out.values())} run(s) that did not finish: {parts}; --all-runs includes them"


class UnknownExperiment(ValueError):
    """The tracking store has no experiment of that name."""


def _experiment_id(client: Any, experiment: str) -> str:
    found = client.get_experiment_by_name(experiment)
    if found is None:
        known = sorted(e.name for e in client.search_experiments())
        raise UnknownExperiment(f"--experiment {experiment!r} does not exist in this tracking store; known: {known}")
    return found.experiment_id


def _status(client: Any, run: Any) -> str:
    """The run's status, after marking a RUNNING run whose process is gone as KILLED."""
    status = run.info.status
    process = run.data.tags.get(PROCESS_TAG)
    if status == "RUNNING" and process and process_is_gone(process):
        log.info("run %s (%s) is RUNNING but its process %s is gone: marking it KILLED", run.info.run_id,
                 run.info.run_name, process)
        client.set_terminated(run.info.run_id, "KILLED")
        return "KILLED"
    return status


def load_runs(
    client: Any, experiment: str, group: str | None = None, all_runs: bool = False
) -> tuple[list[RunRecord], dict[str, int]]:
    """Training runs of ``experiment`` (tag ``progpo.kind=train``, or none: runs older than the tag; report and
    fidelity runs excluded), with final metrics and curve histories; and the number of training runs left out (not
    FINISHED, unless ``all_runs``) by status."""
    query = f"tags.group = '{group}'" if group else ""
    runs = client.search_runs([_experiment_id(client, experiment)], filter_string=query, max_results=5000)
    records = []
    left_out: Counter[str] = Counter()
    for run in runs:
        tags = run.data.tags
        if tags.get(KIND_TAG) not in TRAIN_KINDS:
            continue
        status = _status(client, run)
        if not all_runs and status != "FINISHED":
            left_out[status] += 1
            continue
        record = RunRecord(
            run_id=run.info.run_id,
            method=tags.get("method", "unknown"),
            env=tags.get("env", "unknown"),
            seed=tags.get("seed", "?"),
            ablation=tags.get("ablation") or None,
            status=status,
            final=dict(run.data.metrics),
            group=tags.get("group"),
            machine=tags.get(MACHINE_TAG),
        )
        if record.ablation:
            record.variant = record.ablation
        elif record.method == "progpo":
            record.variant = transition_variant(run.data.params)
        for key in CURVE_KEYS:
            if key in record.final:
                points = client.get_metric_history(run.info.run_id, key)
                record.history[key] = sorted((int(m.step), float(m.value)) for m in points)
        records.append(record)
    log.info("experiment %r: %d training runs%s", experiment, len(records), f" in group {group!r}" if group else "")
    if left_out:
        log.warning("experiment %r: %s", experiment, describe_left_out(left_out))
    return records, dict(left_out)


def _kept_tag(key: str) -> bool:
    return not key.startswith("mlflow.") and key != PROCESS_TAG


def load_fidelity_runs(
    client: Any, experiment: str, group: str | None = None, all_runs: bool = False
) -> tuple[list[FidelityRecord], dict[str, int]]:
    """Credit-fidelity runs of ``experiment`` (tag ``progpo.kind=fidelity``) with their ``fidelity/*`` metrics; and
    the number left out (not FINISHED, unless ``all_runs``) by status."""
    query = f"tags.`{KIND_TAG}` = '{FIDELITY_KIND}'" + (f" and tags.group = '{group}'" if group else "")
    runs = client.search_runs([_experiment_id(client, experiment)], filter_string=query, max_results=5000)
    records = []
    left_out: Counter[str] = Counter()
    for run in runs:
        status = _status(client, run)
        if not all_runs and status != "FINISHED":
            left_out[status] += 1
            continue
        records.append(FidelityRecord(
            run_id=run.info.run_id,
            status=status,
            tags={k: v for k, v in run.data.tags.items() if _kept_tag(k)},
            metrics={k: float(v) for k, v in run.data.metrics.items() if k.startswith("fidelity/")},
            start_time=int(run.info.start_time or 0),
        ))
    if records or left_out:
        log.info("experiment %r: %d fidelity runs", experiment, len(records))
    if left_out:
        log.warning("experiment %r, fidelity runs: %s", experiment, describe_left_out(left_out))
    return records, dict(left_out)
