"""Figure 4/5 draw what the runs logged (held-out points raw, EMA only on dense curves) and Table 1's 95% interval.

Runs are built by hand as ``RunRecord`` objects with known values, and the plotted data is read back from the
returned matplotlib figure.
"""

from __future__ import annotations

import csv
import math
import statistics

import matplotlib
import pytest

from progpo.report import (
    DENSE_MIN_POINTS,
    RunRecord,
    credit_figure,
    ema,
    final_table,
    is_dense,
    success_figure,
    t975,
    to_csv,
    to_markdown,
)

matplotlib.use("Agg")

# Two seeds of held-out success, evaluated every 5 iterations: they end at 0.5 and 0.62, so the mean ends at 0.56
# (an EMA with decay 0.95 would draw it near 0.25).
VAL_SEEDS = ([(0, 0.0), (5, 0.3), (10, 0.5)], [(0, 0.1), (5, 0.4), (10, 0.62)])


def _record(seed: int, history: dict[str, list[tuple[int, float]]], final: dict[str, float] | None = None,
            method: str = "progpo") -> RunRecord:
    return RunRecord(run_id=f"{method}-{seed}", method=method, env="alfworld", seed=str(seed), ablation=None,
                     status="FINISHED", final=final or {}, history=history)


def _dense(seed: int, n: int = 12) -> list[tuple[int, float]]:
    """A training curve logged every iteration, different per seed."""
    return [(it, (it / n) * (0.8 if seed else 0.6) + 0.05 * ((it + seed) % 3)) for it in range(1, n + 1)]


def _means(*seeds: list[tuple[int, float]]) -> list[float]:
    return [statistics.fmean(values) for values in zip(*([y for _, y in s] for s in seeds))]


def _stds(*seeds: list[tuple[int, float]]) -> list[float]:
    return [statistics.stdev(values) for values in zip(*([y for _, y in s] for s in seeds))]


def _errorbar(ax, label: str):
    (container,) = [c for c in ax.containers if c.get_label() == label]
    return container


def _line(ax, label: str):
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == label]
    return line


@pytest.fixture
def figure():
    import matplotlib.pyplot as plt

    made = []
    yield lambda fig: made.append(fig) or fig
    for fig in made:
        plt.close(fig)


def test_density_rule():
    assert not is_dense(range(DENSE_MIN_POINTS - 1)) and is_dense(range(DENSE_MIN_POINTS))


def test_held_out_points_are_the_mean_over_seeds_not_an_ema(figure):
    records = [_record(i, {"val/success": h, "train/success": _dense(i)}) for i, h in enumerate(VAL_SEEDS)]
    fig = figure(success_figure(records, "alfworld"))
    ax = fig.axes[1]
    data_line = _errorbar(ax, "progpo").lines[0]
    assert list(data_line.get_xdata()) == [0, 5, 10]
    assert list(data_line.get_ydata()) == _means(*VAL_SEEDS)  # exactly, point by point
    assert data_line.get_ydata()[-1] == pytest.approx(0.56) and data_line.get_marker() == "o"
    smoothed = ema(_means(*VAL_SEEDS))[-1]
    assert all(not any(math.isclose(y, smoothed) for y in line.get_ydata()) for line in ax.get_lines())
    assert "Held-out: each evaluation as measured (not smoothed)" in fig._suptitle.get_text()


def test_held_out_error_bars_are_one_std_over_seeds(figure):
    records = [_record(i, {"val/success": h}) for i, h in enumerate(VAL_SEEDS)]
    fig = figure(success_figure(records, "alfworld"))
    container = _errorbar(fig.axes[1], "progpo")
    (bars,) = container.lines[2]
    segments = bars.get_segments()
    means, stds = _means(*VAL_SEEDS), _stds(*VAL_SEEDS)
    assert len(segments) == 3
    for (x0, low), (x1, high), step, mean, std in zip(*zip(*segments), (0, 5, 10), means, stds):
        assert x0 == x1 == step
        assert low == pytest.approx(mean - std) and high == pytest.approx(mean + std)
    assert stds[-1] == pytest.approx(statistics.stdev([0.5, 0.62]))
    assert "error bars ±1 sample std over seeds" in fig._suptitle.get_text()


def test_dense_training_curve_is_ema_smoothed_with_a_seed_band(figure):
    seeds = (_dense(0), _dense(1))
    records = [_record(i, {"train/success": s, "val/success": VAL_SEEDS[i]}) for i, s in enumerate(seeds)]
    fig = figure(success_figure(records, "alfworld"))
    ax = fig.axes[0]
    means, stds = _means(*seeds), _stds(*seeds)
    assert list(_line(ax, "progpo").get_ydata()) == pytest.approx(ema(means))  # the dark, labelled line
    assert any(list(line.get_ydata()) == means for line in ax.get_lines())  # the raw mean, light
    assert not ax.containers  # no error bars: the spread is a band
    (band,) = ax.collections
    corners = {(round(x, 9), round(y, 9)) for x, y in band.get_paths()[0].vertices}
    for (step, _), mean, std in zip(seeds[0], means, stds):
        assert (step, round(mean - std, 9)) in corners and (step, round(mean + std, 9)) in corners


def test_sparse_training_curve_is_not_smoothed(figure):
    seeds = ([(1, 0.2), (2, 0.4), (3, 0.9)], [(1, 0.0), (2, 0.6), (3, 0.7)])
    records = [_record(i, {"train/success": s}) for i, s in enumerate(seeds)]
    fig = figure(success_figure(records, "alfworld"))
    ax = fig.axes[0]
    assert list(_errorbar(ax, "progpo").lines[0].get_ydata()) == _means(*seeds)
    smoothed = ema(_means(*seeds))[-1]
    assert all(not any(math.isclose(y, smoothed) for y in line.get_ydata()) for line in ax.get_lines())


def test_score_row_appears_for_runs_that_log_a_purchase_score(figure):
    """WebShop runs log train/score and val/score: a second row draws them like success (held-out raw)."""
    scores = ([(0, 0.30), (4, 0.45), (8, 0.52)], [(0, 0.35), (4, 0.40), (8, 0.61)])
    records = [_record(i, {"val/success": VAL_SEEDS[i], "val/score": scores[i], "train/score": _dense(i)})
               for i in range(2)]
    fig = figure(success_figure(records, "webshop"))
    assert len(fig.axes) == 4 and fig.axes[3].get_title() == "webshop: held-out score"
    held_out = _errorbar(fig.axes[3], "progpo").lines[0]
    assert list(held_out.get_xdata()) == [0, 4, 8] and list(held_out.get_ydata()) == _means(*scores)
    assert list(_line(fig.axes[2], "progpo").get_ydata()) == pytest.approx(ema(_means(_dense(0), _dense(1))))
    assert fig._suptitle.get_text().startswith("Success and score vs iteration")
    # the success row is unchanged by the score row
    assert list(_errorbar(fig.axes[1], "progpo").lines[0].get_ydata()) == _means(*VAL_SEEDS)
    # runs without a score keep the one-row figure
    assert len(figure(success_figure([_record(0, {"val/success": VAL_SEEDS[0]})], "alfworld")).axes) == 2


def test_credit_figure_smooths_only_dense_curves(figure):
    dense = [(it, 0.5 + 0.1 * (it % 2)) for it in range(1, 13)]
    sparse = [(1, 0.1), (2, 0.9)]
    records = [_record(0, {"credit/transition_active": dense, "credit/peer_zero": sparse})]
    fig = figure(credit_figure(records, "alfworld"))
    ax = fig.axes[0]
    assert list(_line(ax, "transition-active").get_ydata()) == pytest.approx(ema([v for _, v in dense]))
    assert list(_line(ax, "peer-zero").get_ydata()) == [0.1, 0.9]
    assert "EMA decay 0.95 when >= 10 points" in fig._suptitle.get_text()


@pytest.mark.parametrize(("values", "t"), [((0.5, 0.7), 12.7062), ((0.4, 0.5, 0.6), 4.3027),
                                           ((0.1, 0.2, 0.3, 0.4, 0.5), 2.7764)])
def test_ci_half_width_is_t_times_std_over_root_n(values, t):
    records = [_record(i, {}, {"val/success": v}) for i, v in enumerate(values)]
    _, (row,) = final_table(records)
    cell = row["cells"]["All"]
    assert cell.ci95 == pytest.approx(t * statistics.stdev(values) / math.sqrt(len(values)), rel=1e-4)
    if len(values) == 3:
        assert cell.std == pytest.approx(0.1) and cell.ci95 == pytest.approx(0.2484, abs=1e-4)


def test_one_seed_has_no_interval_and_the_csv_has_a_ci95_column(tmp_path):
    records = [_record(0, {}, {"val/success": 0.5}),
               *(_record(i, {}, {"val/success": v}, method="grpo") for i, v in enumerate((0.4, 0.5, 0.6)))]
    columns, rows = final_table(records)
    by_method = {row["method"]: row["cells"]["All"] for row in rows}
    assert by_method["progpo"].ci95 is None and by_method["progpo"].std is None
    markdown = to_markdown("T", "note.", columns, rows)
    assert "| alfworld | progpo | 1 | 50.0 |" in markdown
    assert "| alfworld | grpo | 3 | 50.0 ± 10.0 [25.2, 74.8] |" in markdown
    assert "95% confidence interval of the mean over seeds" in markdown
    to_csv(tmp_path / "t.csv", columns, rows)
    with (tmp_path / "t.csv").open() as handle:
        lines = {r["method"]: r for r in csv.DictReader(handle)}
    assert list(lines["grpo"]) == ["env", "method", "metric", "mean", "std", "ci95", "n"]
    assert float(lines["grpo"]["ci95"]) == pytest.approx(0.2484, abs=1e-4)
    assert lines["progpo"]["ci95"] == lines["progpo"]["std"] == ""


def test_t_quantiles_are_students():
    # the printed table of t(0.975, df) (any statistics textbook), and the normal limit
    assert [round(t975(df), 4) for df in (1, 2, 3, 4, 10, 30)] == [12.7062, 4.3027, 3.1824, 2.7764, 2.2281, 2.0423]
    assert t975(10_000) == pytest.approx(1.96, abs=1e-3)
    with pytest.raises(ValueError, match="df"):
        t975(0)
