"""Reading the training runs of an MLflow experiment (``load_runs``): ``RunRecord``, run status, left-out runs."""

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
    """Training runs of ``experiment`` (report runs excluded), with final metrics and curve histories; and the
    number of training runs left out (not FINISHED, unless ``all_runs``) by status."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        known = sorted(e.name for e in client.search_experiments())
        raise UnknownExperiment(f"--experiment {experiment!r} does not exist in this tracking store; known: {known}")
    query = f"tags.group = '{group}'" if group else ""
    runs = client.search_runs([found.experiment_id], filter_string=query, max_results=5000)
    records = []
    left_out: Counter[str] = Counter()
    for run in runs:
        tags = run.data.tags
        if tags.get(KIND_TAG) == "report":
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
