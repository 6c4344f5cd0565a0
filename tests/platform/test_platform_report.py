"""The report command over runs logged directly to a real MLflow sqlite store."""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow.entities import Metric

from progpo.report import ema, main, make_report
from progpo.tracking import PROCESS_TAG
from progpo.tracking.run_info import process_id

TYPES = ("pick_and_place_simple", "pick_two_obj_and_place")


def _log_run(client, experiment_id, method, seed, final_val, *, status="FINISHED", ablation=None, iterations=6,
             machine=None):
    tags = {"method": method, "env": "alfworld", "seed": str(seed), "progpo.kind": "train", "group": "g"}
    if machine:
        tags["machine"] = machine
    if ablation:
        tags["ablation"] = ablation
    run = client.create_run(experiment_id, tags=tags)
    metrics = []
    for it in range(1, iterations + 1):
        metrics.append(Metric("train/success", it / iterations * final_val, 0, it))
        metrics.append(Metric("train/success/pick_and_place_simple", final_val, 0, it))
        if method == "progpo":
            metrics.append(Metric("credit/peer_zero", 0.4, 0, it))
            metrics.append(Metric("credit/transition_active", 0.5 + 0.1 * (it % 2), 0, it))
            metrics.append(Metric("credit/transition_only", 0.1, 0, it))
            metrics.append(Metric("credit/still_zero", 0.3, 0, it))
            metrics.append(Metric("credit/multi_depth", 0.7, 0, it))
    for it in (0, iterations // 2, iterations):
        metrics.append(Metric("val/success", final_val * (it / iterations), 0, it))
        metrics.append(Metric("val/success/pick_and_place_simple", final_val, 0, it))
        metrics.append(Metric("val/success/pick_two_obj_and_place", final_val / 2, 0, it))
    client.log_batch(run.info.run_id, metrics=metrics)
    client.set_terminated(run.info.run_id, status)
    return run.info.run_id


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("cmp")
    for seed, (g, p) in enumerate([(0.5, 0.75), (0.7, 0.95)]):
        _log_run(client, exp, "grpo", seed, g)
        _log_run(client, exp, "progpo", seed, p)
    _log_run(client, exp, "progpo", 9, 0.0, status="FAILED")  # excluded: did not finish
    abl = client.create_experiment("abl")
    for variant, value in (("plain", 0.5), ("full", 0.9)):
        _log_run(client, abl, "progpo", 0, value, ablation=variant)
    return uri, client


def _csv(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    with path.open() as handle:
        return {(r["method"], r["metric"]): r for r in csv.DictReader(handle)}


def test_ema_is_bias_corrected():
    assert ema([1.0]) == [1.0]
    values = ema([0.0, 1.0, 1.0], decay=0.5)
    assert values[0] == 0.0 and values[1] == pytest.approx(0.5 / 0.75) and values[2] == pytest.approx(0.75 / 0.875)
    with pytest.raises(ValueError, match="decay"):
        ema([1.0], decay=1.0)


def test_report_tables_figures_and_mlflow_run(store, tmp_path):
    uri, client = store
    files = make_report("cmp", tmp_path / "out", tracking_uri=uri)
    assert files.n_runs == 4
    table1 = _csv(tmp_path / "out" / "table1_success.csv")
    assert float(table1[("progpo", "All")]["mean"]) == pytest.approx(0.85)
    assert float(table1[("progpo", "All")]["std"]) == pytest.approx(statistics.stdev([0.75, 0.95]))
    assert float(table1[("grpo", "Pick2")]["mean"]) == pytest.approx(0.3)
    assert table1[("grpo", "All")]["n"] == "2"
    assert float(table1[("grpo", "All")]["ci95"]) == pytest.approx(12.7062 * statistics.stdev([0.5, 0.7]) / 2**0.5,
                                                                   rel=1e-4)
    markdown = (tmp_path / "out" / "table1_success.md").read_text()
    assert "| env | method | seeds | Pick | Pick2 | All |" in markdown
    # mean ± std [95% t-interval, t(0.975, 1) = 12.706]: two seeds say little
    assert ("| alfworld | grpo | 2 | 60.0 ± 14.1 [-67.1, 187.1] | 30.0 ± 7.1 [-33.5, 93.5] "
            "| 60.0 ± 14.1 [-67.1, 187.1] |") in markdown
    assert markdown.index("| alfworld | grpo") < markdown.index("| alfworld | progpo")  # the paper's order

    table2 = _csv(tmp_path / "out" / "table2_credit.csv")
    assert float(table2[("progpo", "transition_active")]["mean"]) == pytest.approx(0.55)
    assert float(table2[("progpo", "still_zero")]["mean"]) == pytest.approx(0.3)
    assert not any(method == "grpo" for method, _ in table2)  # grpo logged no credit diagnostics
    assert not (tmp_path / "out" / "table3_ablation.md").exists()

    names = sorted(p.name for p in files.figures)
    assert names == ["fig4_success_alfworld.png", "fig5_credit_alfworld.png"]
    for path in files.figures:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000

    report_runs = client.search_runs([client.get_experiment_by_name("cmp").experiment_id],
                                     filter_string="tags.`progpo.kind` = 'report'")
    assert [r.info.run_id for r in report_runs] == [files.report_run_id]
    artifacts = {a.path for a in client.list_artifacts(files.report_run_id, "report")}
    assert {"report/table1_success.md", "report/fig4_success_alfworld.png", "report/report.md"} <= artifacts

    again = make_report("cmp", tmp_path / "out2", tracking_uri=uri)  # the report run is reused, not duplicated
    assert again.report_run_id == files.report_run_id and again.n_runs == 4


def test_per_seed_table_pairs_each_runs_first_and_last_evaluation(store, tmp_path):
    uri, _ = store
    make_report("cmp", tmp_path / "out", tracking_uri=uri, upload=False)
    with (tmp_path / "out" / "table1_seeds.csv").open() as handle:
        rows = {(r["method"], r["seed"]): r for r in csv.DictReader(handle)}
    assert set(rows) == {("grpo", "0"), ("grpo", "1"), ("progpo", "0"), ("progpo", "1")}  # FAILED run left out
    progpo1 = rows[("progpo", "1")]  # logged val/success 0 at iteration 0, 0.95 at iteration 6
    assert (int(progpo1["start_step"]), int(progpo1["end_step"])) == (0, 6)
    assert float(progpo1["start"]) == 0.0 and float(progpo1["end"]) == pytest.approx(0.95)
    assert float(progpo1["change"]) == pytest.approx(0.95)
    assert "| alfworld | progpo | 1 | 0.0 (it 0) | 95.0 (it 6) | +95.0 |" in (tmp_path / "out" / "table1_seeds.md").read_text()
    assert not (tmp_path / "out" / "table1_seeds_score.md").exists()  # these runs logged no score
    assert not (tmp_path / "out" / "table1_seeds_options.md").exists()


def test_webshop_runs_get_a_per_seed_score_table_and_a_score_row(tmp_path):
    """Runs that log WebShop's purchase score: table1_seeds_score pairs each run's first and last held-out score."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("shop")
    for seed, (start, end) in enumerate([(0.40, 0.52), (0.46, 0.41)]):
        run = client.create_run(exp, tags={"method": "progpo", "env": "webshop", "seed": str(seed),
                                           "progpo.kind": "train"})
        metrics = [Metric("train/score", 0.3 + 0.01 * it, 0, it) for it in range(1, 9)]
        metrics += [Metric("train/success", 0.02, 0, it) for it in range(1, 9)]
        for it, score in ((0, start), (4, (start + end) / 2), (8, end)):
            metrics += [Metric("val/score", score, 0, it), Metric("val/success", 0.01 * it, 0, it),
                        Metric("val/option_match", 0.1 + 0.05 * it * (1 - seed), 0, it)]
        client.log_batch(run.info.run_id, metrics=metrics)
        client.set_terminated(run.info.run_id, "FINISHED")
    files = make_report("shop", tmp_path / "out", tracking_uri=uri, upload=False)
    with (tmp_path / "out" / "table1_seeds_score.csv").open() as handle:
        rows = {r["seed"]: r for r in csv.DictReader(handle)}
    assert float(rows["0"]["start"]) == pytest.approx(0.40) and float(rows["0"]["end"]) == pytest.approx(0.52)
    assert float(rows["1"]["change"]) == pytest.approx(-0.05)
    markdown = (tmp_path / "out" / "table1_seeds_score.md").read_text()
    assert "| webshop | progpo | 0 | 0.400 (it 0) | 0.520 (it 8) | +0.120 |" in markdown
    assert "| webshop | progpo | 1 | 1.0 (it 0) |" not in markdown  # success stays in its own (percent) table
    assert "| webshop | progpo | 1 | 0.0 (it 0) | 8.0 (it 8) | +8.0 |" in (tmp_path / "out" / "table1_seeds.md").read_text()
    options = (tmp_path / "out" / "table1_seeds_options.md").read_text()
    assert "| webshop | progpo | 0 | 0.100 (it 0) | 0.500 (it 8) | +0.400 |" in options
    assert "| webshop | progpo | 1 | 0.100 (it 0) | 0.100 (it 8) | +0.000 |" in options
    import matplotlib.image

    assert [p.name for p in files.figures if "success" in p.name] == ["fig4_success_webshop.png"]
    height, width, _ = matplotlib.image.imread(tmp_path / "out" / "fig4_success_webshop.png").shape
    assert height > 0.7 * width  # two rows: success, then score


def test_ablation_report_has_table3(store, tmp_path):
    uri, _ = store
    make_report("abl", tmp_path / "abl", tracking_uri=uri, upload=False)
    table3 = _csv(tmp_path / "abl" / "table3_ablation.csv")
    assert float(table3[("progpo[full]", "All")]["mean"]) == pytest.approx(0.9)  # last train/success
    assert float(table3[("progpo[plain]", "Pick")]["mean"]) == pytest.approx(0.5)
    text = (tmp_path / "abl" / "table3_ablation.md").read_text()
    assert text.index("progpo[plain]") < text.index("progpo[full]")


def test_untagged_progpo_runs_count_as_their_variant_once_per_seed(tmp_path):
    """A compare_methods ProGPO run at the paper defaults is Table 3's `full` (not trained twice); a run tagged
    `full` for the same seed wins over it; GRPO and runs without credit params never enter Table 3."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("mixed")
    _log_run(client, exp, "progpo", 0, 0.3, ablation="plain")
    _log_run(client, exp, "grpo", 0, 0.1)
    for seed, value in ((0, 0.6), (1, 0.8)):
        run_id = _log_run(client, exp, "progpo", seed, value)
        client.log_param(run_id, "credit.min_value_group", "3")
        client.log_param(run_id, "credit.fusion", "inverse_variance")
    _log_run(client, exp, "progpo", 1, 0.2, ablation="full")  # seed 1 also trained as tagged `full`: it wins
    make_report("mixed", tmp_path / "out", tracking_uri=uri, upload=False)
    table3 = _csv(tmp_path / "out" / "table3_ablation.csv")
    assert {m for m, _ in table3} == {"progpo[plain]", "progpo[full]"}
    full = table3[("progpo[full]", "All")]
    assert int(full["n"]) == 2 and float(full["mean"]) == pytest.approx((0.6 + 0.2) / 2)
    table1 = _csv(tmp_path / "out" / "table1_success.csv")
    assert ("progpo", "All") in table1 and int(table1[("progpo", "All")]["n"]) == 2  # Table 1 keeps its labels
    figures = {p.name for p in (tmp_path / "out").glob("*.png")}  # methods and variants in separate figures
    assert figures == {"fig4_success_alfworld.png", "fig5_credit_alfworld.png", "fig4_ablation_alfworld.png",
                       "fig5_ablation_alfworld.png"}


def test_cli_errors_name_the_problem(store, tmp_path, capsys):
    uri, _ = store
    assert main(["--experiment", "nope", "--tracking-uri", uri, "--out", str(tmp_path / "x")]) == 2
    assert main(["--experiment", "cmp", "--tracking-uri", uri, "--group", "other", "--no-upload",
                 "--out", str(tmp_path / "x")]) == 2
    assert main(["--experiment", "cmp", "--tracking-uri", uri, "--group", "g", "--no-upload",
                 "--out", str(tmp_path / "y")]) == 0
    assert "Table 1: final held-out success" in capsys.readouterr().out


def test_unfinished_runs_are_left_out_counted_and_dead_ones_marked_killed(store, tmp_path, capsys):
    uri, client = store
    experiment = client.get_experiment_by_name("cmp").experiment_id
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_tag = process_id(dead.pid)  # a process of this host that ends below
    dead.wait(timeout=30)
    killed = _log_run(client, experiment, "progpo", 7, 0.1, status="RUNNING")
    client.set_tag(killed, PROCESS_TAG, dead_tag)
    live = _log_run(client, experiment, "grpo", 8, 0.1, status="RUNNING")
    client.set_tag(live, PROCESS_TAG, process_id())  # this very process: still training
    elsewhere = _log_run(client, experiment, "grpo", 9, 0.1, status="RUNNING")
    client.set_tag(elsewhere, PROCESS_TAG, "another-host/1/1.00")

    assert main(["--experiment", "cmp", "--tracking-uri", uri, "--no-upload", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "from 4 FINISHED run(s); left out 4 run(s) that did not finish: 2 RUNNING" in out
    assert "1 KILLED (killed or pruned" in out and "1 FAILED (raised an error)" in out
    assert client.get_run(killed).info.status == "KILLED"  # its process is gone
    assert client.get_run(live).info.status == client.get_run(elsewhere).info.status == "RUNNING"
    table = (tmp_path / "r" / "table1_success.md").read_text()
    assert "| alfworld | progpo | 2 |" in table  # seeds 0 and 1 only: the killed run's start value is not "final"


REPORT_FILES = ("table1_success.csv", "table1_seeds.csv", "table2_credit.csv", "table1_success.md",
                "table2_credit.md")


def test_runs_json_rebuilds_the_report_without_the_store(store, tmp_path):
    """The store is local and git-ignored: a committed report's runs.json alone gives the same tables."""
    uri, _ = store
    first = make_report("cmp", tmp_path / "first", tracking_uri=uri, upload=False)
    assert tmp_path / "first" / "runs.json" in first.tables
    empty_store = f"sqlite:///{tmp_path / 'fresh.db'}"  # another clone: no experiment `cmp` at all
    rebuilt = make_report("cmp", tmp_path / "rebuilt", tracking_uri=empty_store,
                          archives=[tmp_path / "first" / "runs.json"])
    assert rebuilt.n_runs == 4 and rebuilt.report_run_id is None  # nothing to attach it to
    for name in REPORT_FILES:
        assert (tmp_path / "rebuilt" / name).read_text() == (tmp_path / "first" / name).read_text(), name
    archived = json.loads((tmp_path / "rebuilt" / "runs.json").read_text())
    curve = next(r for r in archived["runs"] if r["method"] == "progpo" and r["seed"] == "1")["history"]
    assert curve["val/success"] == [[0, 0.0], [3, pytest.approx(0.475)], [6, pytest.approx(0.95)]]


def test_archived_runs_join_the_stores_once(store, tmp_path):
    """New seeds in a store extend an archived benchmark; a run both hold counts once; --group filters both."""
    uri, client = store
    make_report("cmp", tmp_path / "old", tracking_uri=uri, upload=False)
    archive = tmp_path / "old" / "runs.json"
    same = make_report("cmp", tmp_path / "same", tracking_uri=uri, upload=False, archives=[archive])
    assert same.n_runs == 4  # the archive's runs are the store's own

    new_uri = f"sqlite:///{tmp_path / 'new.db'}"
    new_client = mlflow.MlflowClient(new_uri)
    _log_run(new_client, new_client.create_experiment("cmp"), "grpo", 2, 0.9)
    grown = make_report("cmp", tmp_path / "grown", tracking_uri=new_uri, upload=False, archives=[archive])
    assert grown.n_runs == 5
    table1 = _csv(tmp_path / "grown" / "table1_success.csv")
    assert table1[("grpo", "All")]["n"] == "3" and float(table1[("grpo", "All")]["mean"]) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="no FINISHED training runs in group 'other'"):
        make_report("cmp", tmp_path / "none", tracking_uri=f"sqlite:///{tmp_path / 'e.db'}", group="other",
                    archives=[archive])


def test_bad_records_files_are_named(store, tmp_path, caplog):
    uri, _ = store
    make_report("cmp", tmp_path / "old", tracking_uri=uri, upload=False)
    archive = tmp_path / "old" / "runs.json"
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"version": 1, "experiment": "cmp", "runs": [{"run_id": "x"}]}))
    cases = [(["--experiment", "abl", "--records", str(archive)], "holds experiment 'cmp', not --experiment 'abl'"),
             (["--experiment", "cmp", "--records", str(tmp_path / "missing.json")], "missing.json: no such file"),
             (["--experiment", "cmp", "--records", str(broken)], "broken.json: not JSON"),
             (["--experiment", "cmp", "--records", str(foreign)], "run #0 lacks ['method', 'env', 'seed', 'final']")]
    for argv, message in cases:
        caplog.clear()
        assert main([*argv, "--tracking-uri", uri, "--no-upload", "--out", str(tmp_path / "x")]) == 2
        assert message in caplog.text


def test_report_names_the_machines_and_warns_when_they_differ(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("m")
    _log_run(client, exp, "grpo", 0, 0.5, machine="CPU A, 2 CPUs, no fast bf16")
    _log_run(client, exp, "grpo", 1, 0.5, machine="CPU A, 2 CPUs, no fast bf16")
    make_report("m", tmp_path / "one", tracking_uri=uri, upload=False)
    text = (tmp_path / "one" / "report.md").read_text()
    assert "Machines: CPU A, 2 CPUs, no fast bf16: 2 run(s)." in text and "more than one machine" not in text
    _log_run(client, exp, "grpo", 2, 0.5, machine="CPU B, 2 CPUs, avx512_bf16")
    make_report("m", tmp_path / "two", tracking_uri=uri, upload=False)
    assert "Runs from more than one machine" in (tmp_path / "two" / "report.md").read_text()


def test_runs_are_tagged_with_their_machine():
    from omegaconf import OmegaConf

    from progpo.hardware import machine_label
    from progpo.tracking.run_info import derive_tags

    tags = derive_tags(OmegaConf.create({"seed": 0}), "exp", None)
    assert tags["machine"] == machine_label()
    assert tags["machine"].endswith(("bf16", "no fast bf16")) and " CPUs, " in tags["machine"]
