"""The Monte-Carlo truth against a closed form, and the scores against plain loops written from their definitions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from chain import ACTIONS, PROBS, chain_collector, next_cell, true_values
from scipy.stats import spearmanr

from progpo.algo.iteration import step_batch
from progpo.fidelity import FidelityTruth, noise_floor, score
from progpo.fidelity.scoring import metric_rows
from progpo.fidelity.selection import step_features, stratified_sample
from progpo.fidelity.truth import ARRAYS, discounted_return, measure_truth
from progpo.rollout.collector import EpisodeStart

GAMMA = 0.95


@pytest.fixture(scope="module", params=["sampled", "complement"])
def chain_measurement(request):
    """A recorded batch of the chain, its true advantages, and their Monte-Carlo estimates (64 + 64 per step) by
    either estimator."""
    torch.manual_seed(0)
    collector = chain_collector()
    try:
        batch = collector.collect(collector.suite.train_tasks, group_size=6)
        steps = step_batch(batch.turns, None)
        won = {e.traj: e.won for e in batch.episodes}
        chosen = stratified_sample(step_features(steps, won), 40, seed=0)
        played = measure_truth(collector, batch.turns, batch.episodes, chosen, 64, GAMMA, chunk=1000,
                               complement=request.param == "complement")
    finally:
        collector.close()
    _, true_q = true_values(GAMMA)
    true_v, _ = true_values(GAMMA)
    true_a = []
    for i in chosen:
        turn = batch.turns[i]
        cell = 0
        for earlier in sorted((x for x in batch.turns if x.traj == turn.traj and x.t < turn.t), key=lambda x: x.t):
            cell = next_cell(cell, earlier.action)
        true_a.append(true_q[turn.t, cell, ACTIONS.index(turn.action)] - true_v[turn.t, cell])
    truth = FidelityTruth.measured(steps, won, chosen, played, meta={"gamma": GAMMA})
    assert played.complement.all() == (request.param == "complement")  # every chain action is admissible
    np.testing.assert_allclose(played.p_action, [PROBS[ACTIONS.index(batch.turns[i].action)] for i in chosen])
    return truth, np.array(true_a), played.kept, played.timing


def test_a_hat_converges_to_the_closed_form_within_its_standard_error(chain_measurement):
    truth, true_a, kept, timing = chain_measurement
    assert kept.all()  # a deterministic env replays exactly
    exact = truth.se == 0  # every continuation ends alike (e.g. the last step): then A_hat must be exact
    np.testing.assert_allclose(truth.a_hat[exact], true_a[exact], atol=1e-9)
    z = (truth.a_hat - true_a)[~exact] / truth.se[~exact]
    assert np.abs(z).max() < 4.5
    assert 0.4 < np.mean(z**2) < 1.8  # the standard errors are the right size, neither too small nor too large
    assert np.abs(true_a).max() > 1.0  # the chain has advantages worth measuring
    assert timing.episodes == 2 * 64 * len(truth.steps) and timing.replay_steps > 0


def test_exact_estimator_scores_near_the_noise_floor_noise_near_zero_flipped_negative(chain_measurement):
    truth, true_a, _, _ = chain_measurement
    rng = np.random.default_rng(1)
    noise = {f"noise{k}": rng.standard_normal(len(true_a)) for k in range(40)}
    scores = score({"exact": true_a, "flipped": -true_a, **noise}, truth.a_hat, truth.se, resamples=500)
    floor = noise_floor(truth.a_hat, truth.se)
    exact = scores.values["exact"]["pearson"]
    assert abs(exact.value - floor["pearson"]) < 0.1
    assert exact.low <= floor["pearson"] + 0.05
    assert exact.value > 0.8
    noise_rho = [scores.values[k]["spearman"] for k in noise]
    assert abs(np.mean([r.value for r in noise_rho])) < 0.08  # noise correlates with nothing
    assert np.mean([r.low < 0 < r.high for r in noise_rho]) >= 0.85  # and its interval says so (95% nominal)
    assert scores.values["flipped"]["spearman"].value == pytest.approx(-scores.values["exact"]["spearman"].value)
    assert scores.values["flipped"]["wrong_sign"].value > 0.9
    assert scores.values["exact"]["sign_agreement"].value > 0.9
    difference = scores.paired("exact", "noise0", "spearman")
    assert difference.low > 0  # the paired interval separates them


def test_truth_file_round_trip(chain_measurement, tmp_path):
    truth = chain_measurement[0]
    loaded = FidelityTruth.load(truth.save(tmp_path / "truth.npz"))
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(loaded, name), getattr(truth, name))
    assert loaded.embedding is None and loaded.meta["gamma"] == GAMMA
    assert not list(tmp_path.glob("*.partial"))


def test_metrics_against_plain_loops():
    rng = np.random.default_rng(3)
    est = np.round(rng.standard_normal(60), 1)  # ties, as credit has them
    est[:10] = 0.0
    hat = rng.standard_normal(60)
    se = rng.uniform(0.1, 0.6, 60)
    rows = metric_rows(est, hat, se)
    assert rows["spearman"] == pytest.approx(spearmanr(est, hat).statistic)
    assert rows["pearson"] == pytest.approx(np.corrcoef(est, hat)[0, 1])
    significant = [i for i in range(60) if abs(hat[i]) > 2 * se[i]]
    agree = sum(1 for i in significant if est[i] != 0 and np.sign(est[i]) == np.sign(hat[i]))
    wrong = sum(1 for i in significant if est[i] != 0 and np.sign(est[i]) != np.sign(hat[i]))
    covered = sum(1 for i in significant if est[i] != 0)
    assert rows["sign_agreement"] == pytest.approx(agree / len(significant))
    assert rows["wrong_sign"] == pytest.approx(wrong / len(significant))
    assert rows["coverage"] == pytest.approx(covered / len(significant))
    cosine = sum(e * h for e, h in zip(est, hat)) / (sum(e * e for e in est) ** 0.5 * sum(h * h for h in hat) ** 0.5)
    assert rows["alignment"] == pytest.approx(cosine)
    assert metric_rows(np.zeros(60), hat, se)["spearman"] == 0.0  # a constant estimate carries no ordering


def test_stratified_sample_spreads_over_strata_and_takes_small_ones_whole():
    rng = np.random.default_rng(0)
    n = 500
    features = {"peers": rng.random(n) < 0.9, "late": rng.random(n) < 0.5, "won": rng.random(n) < 0.1}
    chosen = stratified_sample(features, 80, seed=0)
    assert len(chosen) == len(set(chosen.tolist())) == 80
    assert np.all(np.diff(chosen) > 0)
    code = features["peers"] * 1 + features["late"] * 2 + features["won"] * 4
    sizes = np.bincount(code, minlength=8)
    taken = np.bincount(code[chosen], minlength=8)
    for c in range(8):
        # every stratum gets the same share (to one step of rounding) unless it is smaller: then all of it
        assert taken[c] == sizes[c] or taken[c] >= taken.max() - 1
    with pytest.raises(ValueError, match="fidelity.steps"):
        stratified_sample(features, n + 1, seed=0)


def test_discounted_return_is_the_estimators_return_to_go():
    assert discounted_return([0.0, -0.1, 0.0, 10.0], 1, 0.5) == pytest.approx(-0.1 + 0.25 * 10.0)


def test_a_diverging_replay_is_reported_and_its_step_dropped():
    torch.manual_seed(0)
    collector = chain_collector(2)
    try:
        batch = collector.collect(collector.suite.train_tasks, group_size=2)
        turns = sorted((x for x in batch.turns if x.traj == 0), key=lambda x: x.t)
        task = batch.episodes[0].task
        good = EpisodeStart(task, tuple(x.action for x in turns), tuple(x.obs_id for x in turns),
                            tuple(x.reward for x in turns))
        wrong_obs = EpisodeStart(task, good.actions, (good.expected_obs[0] + 1, *good.expected_obs[1:]),
                                 good.expected_rewards)
        wrong_reward = EpisodeStart(task, good.actions, good.expected_obs,
                                    (*good.expected_rewards[:-1], good.expected_rewards[-1] + 1.0))
        played = collector.continue_from([good, wrong_obs, wrong_reward])
    finally:
        collector.close()
    assert played.episodes[0].diverged_at is None
    assert played.episodes[0].rewards == [x.reward for x in turns]  # the whole record, replayed exactly
    assert played.episodes[1].diverged_at == 0
    assert played.episodes[2].diverged_at == len(turns) - 1


def test_the_complement_estimator_is_tighter_on_the_same_steps():
    """Same steps, same number of continuations: leaving a_t out of the V continuations cuts the standard error by
    (1 - p) (the chain's policy is not very confident, so the gain here is the modest end of it)."""
    torch.manual_seed(0)
    collector = chain_collector()
    try:
        batch = collector.collect(collector.suite.train_tasks, group_size=6)
        chosen = np.arange(0, len(batch.turns), 3)
        steps = step_batch(batch.turns, None)
        won = {e.traj: e.won for e in batch.episodes}
        sampled, complement = (
            FidelityTruth.measured(steps, won, chosen, measure_truth(
                collector, batch.turns, batch.episodes, chosen, 32, GAMMA, chunk=1000, complement=exclude), {})
            for exclude in (False, True))
    finally:
        collector.close()
    assert complement.complement.all() and not sampled.complement.any()
    assert np.median(complement.se) < np.median(sampled.se)


def test_measure_truth_drops_and_counts_the_steps_whose_replay_diverges():
    torch.manual_seed(0)
    collector = chain_collector(2)
    try:
        batch = collector.collect(collector.suite.train_tasks, group_size=2)
        own = sorted((x for x in batch.turns if x.traj == 0), key=lambda x: x.t)
        assert len(own) >= 3
        own[1].obs_id += 1  # the record no longer matches what the env shows at step 1 of trajectory 0
        steps = np.array([batch.turns.index(x) for x in own] + [batch.turns.index(x) for x in batch.turns
                                                               if x.traj == 1][:2])
        played = measure_truth(collector, batch.turns, batch.episodes, steps, 2, GAMMA, chunk=1000)
    finally:
        collector.close()
    # step 0 of trajectory 0: its V replay stops before step 1, its Q replay arrives at the wrong observation
    assert played.kept.tolist() == [False] * len(own) + [True, True]


def test_budget_table_shows_what_fewer_steps_and_continuations_would_have_given(chain_measurement, tmp_path):
    from progpo.fidelity.budget import budget_table, main

    truth = chain_measurement[0]
    rows = {(r.steps, r.continuations): r for r in budget_table(truth, [10, 40], [4, 64], resamples=200)}
    assert set(rows) == {(10, 4), (40, 4), (10, 64), (40, 64)}
    assert rows[(40, 64)].rms_se < rows[(40, 4)].rms_se  # more continuations, less noise
    assert rows[(40, 64)].floor_spearman > rows[(40, 4)].floor_spearman  # and a higher ceiling
    assert rows[(40, 64)].ci_width < rows[(10, 64)].ci_width  # more steps, a tighter interval
    table = main([str(truth.save(tmp_path / "truth.npz")), "--steps", "20", "--continuations", "8"])
    assert "| 20 | 8 |" in table
