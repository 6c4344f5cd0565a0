"""Where a run's time went (``progpo.summary.time_table``) against sums written out by hand, and the record's rows
of this process (a resumed run restores the earlier rows, whose seconds this process did not spend)."""

from __future__ import annotations

import pytest

from progpo.lit.callbacks import RunRecord
from progpo.summary import time_table


def parse(table: str) -> dict[str, tuple[float, str]]:
    """``label -> (seconds, share)`` of a time table's body rows."""
    rows = {}
    for line in table.splitlines()[2:]:
        label, seconds, share = (cell.strip() for cell in line.strip("|").split("|"))
        rows[label] = (float(seconds), share)
    return rows


ROWS = [
    {"step": 0.0, "val/success": 0.4, "perf/val_rollout_s": 20.0},
    {"step": 1.0, "train/success": 0.5, "perf/rollout_s": 10.0, "perf/score_s": 4.0, "perf/credit_s": 0.5,
     "perf/update_s": 15.0, "perf/sync_s": 0.0, "perf/tokens_per_s": 1300.0, "perf/env_steps_per_s": 150.0},
    {"step": 2.0, "train/success": 0.6, "perf/rollout_s": 12.0, "perf/score_s": 5.0, "perf/credit_s": 0.2,
     "perf/update_s": 17.0, "perf/sync_s": 0.0, "perf/tokens_per_s": 1200.0, "perf/env_steps_per_s": 140.0},
    {"step": 2.0, "val/success": 0.5, "perf/val_rollout_s": 15.0},
]


def test_time_table_sums_each_part_as_a_loop_does():
    build_s, total_s = 6.0, 120.0
    rows = parse(time_table(ROWS, build_s, total_s))
    rollout = score = credit = update = evaluation = 0.0
    for row in ROWS:
        if "perf/rollout_s" in row:
            rollout += row["perf/rollout_s"]
            score += row["perf/score_s"]
            credit += row["perf/credit_s"]
            update += row["perf/update_s"]
        evaluation += row.get("perf/val_rollout_s", 0.0)
    iterations = rollout + score + credit + update
    assert rows["build (tracking store, env suite, model, engine)"][0] == build_s
    assert rows["held-out evaluation (2)"][0] == evaluation == 35.0
    assert rows["RL iterations (2)"][0] == pytest.approx(iterations, abs=0.05)  # printed to 0.1 s
    assert rows["- rollout"][0] == rollout and rows["- scoring"][0] == score and rows["- update"][0] == update
    assert rows["- credit"][0] == pytest.approx(credit, abs=0.05)
    assert "- weight sync" not in rows  # a phase that took no time (HF engine: no weight sync) is not listed
    # throughputs are not seconds: perf/tokens_per_s must not count as a phase
    assert not any("tokens" in label or "env_steps" in label for label in rows)
    rest = total_s - build_s - evaluation - iterations
    assert rows["checkpoints, logging, plots, the rest"][0] == pytest.approx(rest, abs=0.05)
    assert rows["**total** (build to summary)"] == (total_s, "100%")
    assert rows["held-out evaluation (2)"][1] == f"{100 * evaluation / total_s:.0f}%"


def test_time_table_lists_vllm_weight_sync_and_tolerates_no_iteration():
    rows = parse(time_table([{**ROWS[1], "perf/sync_s": 2.5}], 1.0, 40.0))
    assert rows["- weight sync"][0] == 2.5
    only_eval = parse(time_table(ROWS[:1], 1.0, 30.0))
    assert "RL iterations (0)" not in only_eval and "held-out evaluation (1)" in only_eval
    assert only_eval["checkpoints, logging, plots, the rest"][0] == 9.0


class Trainer:
    is_global_zero = True
    logger = None


def test_run_record_rows_of_this_process_leave_out_the_restored_ones(tmp_path):
    first = RunRecord(tmp_path / "a.jsonl")
    for row in ROWS[:2]:
        first._append(Trainer(), int(row["step"]), {k: v for k, v in row.items() if k != "step"})
    assert first.rows_this_process() == ROWS[:2]
    checkpoint: dict = {}
    first.on_save_checkpoint(Trainer(), None, checkpoint)

    resumed = RunRecord(tmp_path / "b.jsonl")
    resumed.on_load_checkpoint(None, None, checkpoint)
    assert resumed.history == ROWS[:2] and resumed.rows_this_process() == []
    resumed._append(Trainer(), 2, {"perf/rollout_s": 12.0})
    assert len(resumed.history) == 3
    assert resumed.rows_this_process() == [{"step": 2.0, "perf/rollout_s": 12.0}]
