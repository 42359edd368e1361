"""The routing policies on small hand-made outcome matrices, where each answer can be worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from hacrl_fed.route import policies as P

# two models: 0 is cheap and good on task "a", 1 is expensive and good on task "b"
CORRECT = np.array([[1, 1, 1, 0, 0, 0],
                    [0, 0, 1, 1, 1, 1]], dtype=float)
TASKS = ["a", "a", "a", "b", "b", "b"]
COST = np.array([1.0, 4.0])


def test_best_single_picks_the_most_accurate_model_for_every_query():
    assert P.best_single(CORRECT, COST, 3).tolist() == [1, 1, 1]


def test_best_single_breaks_a_tie_towards_the_cheaper_model():
    tied = np.array([[1, 0], [0, 1]], dtype=float)
    assert P.best_single(tied, np.array([5.0, 2.0]), 2).tolist() == [1, 1]
    assert P.best_single(tied, np.array([2.0, 5.0]), 2).tolist() == [0, 0]


def test_best_per_task_uses_each_tasks_calibration_winner_and_falls_back_for_unknown_tasks():
    assert P.best_per_task(CORRECT, COST, TASKS, ["b", "a", "c"]).tolist() == [1, 0, 1]


def test_best_per_task_rejects_tasks_that_do_not_match_the_calibration():
    with pytest.raises(ValueError, match="calibration tasks"):
        P.best_per_task(CORRECT, COST, TASKS[:-1], ["a"])


def test_knn_predicts_the_neighbours_mean_correctness():
    # query 0 is nearest to calibration 0 and 1 (task a), query 1 to calibration 4 and 5 (task b)
    sim = np.array([[0.9, 0.8, 0.3, 0.0, 0.2, 0.1],
                    [0.0, 0.1, 0.2, 0.3, 0.9, 0.8]])
    pred = P.knn_predict(sim, CORRECT, k=2)
    assert pred.shape == (2, 2)
    assert pred.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    # k = 3 adds calibration 2 (both right) for query 0 and calibration 3 (model 1 right) for query 1
    assert np.allclose(P.knn_predict(sim, CORRECT, k=3), [[1.0, 1 / 3], [0.0, 1.0]])


def test_knn_leaves_out_excluded_pairs():
    sim = np.array([[-np.inf, 0.5, 0.4, -np.inf, -np.inf, -np.inf]])
    # only two usable neighbours even with k = 4: calibration 1 and 2
    assert P.knn_predict(sim, CORRECT, k=4).tolist() == [[1.0, 0.5]]


def test_knn_validates_its_inputs():
    with pytest.raises(ValueError, match="k must be"):
        P.knn_predict(np.zeros((1, 6)), CORRECT, k=0)
    with pytest.raises(ValueError, match="disagree"):
        P.knn_predict(np.zeros((1, 5)), CORRECT, k=1)


def test_rank_models_orders_by_prediction_then_cost():
    pred = np.array([[0.2, 0.9, 0.5], [0.5, 0.5, 0.1]])
    assert P.rank_models(pred, np.array([1.0, 2.0, 3.0])).tolist() == [[1, 2, 0], [0, 1, 2]]
    assert P.rank_models(pred, np.array([3.0, 2.0, 1.0])).tolist() == [[1, 2, 0], [1, 0, 2]]


def test_cost_aware_takes_the_cheapest_model_reaching_the_target():
    pred = np.array([[0.6, 0.9], [0.3, 0.9], [0.2, 0.1]])
    assert P.cost_aware(pred, COST, 0.5).tolist() == [0, 1, 0]   # last: none reaches it → the higher prediction
    assert P.cost_aware(pred, COST, 0.0).tolist() == [0, 0, 0]   # everything reaches 0 → always the cheapest
    assert P.cost_aware(pred, COST, 0.95).tolist() == [1, 1, 0]


def test_oracle_is_the_cheapest_correct_model():
    correct = np.array([[1, 0, 0], [1, 1, 0]], dtype=float)
    assert P.oracle(correct, COST).tolist() == [0, 1, 0]
    per_query = np.array([[9.0, 1.0, 5.0], [1.0, 1.0, 1.0]])       # measured cost per query
    assert P.oracle(correct, per_query).tolist() == [1, 1, 1]


def test_predicted_cost_is_mean_tokens_times_parameters():
    tokens = np.array([[10, 20], [4, 4]], dtype=float)
    assert P.predicted_cost(tokens, [2.0, 100.0]).tolist() == [30.0, 400.0]
    assert P.predicted_cost(tokens).tolist() == [15.0, 4.0]


def test_bad_cost_is_refused():
    with pytest.raises(ValueError, match="cost must have shape"):
        P.best_single(CORRECT, np.array([1.0]), 1)
    with pytest.raises(ValueError, match="finite"):
        P.best_single(CORRECT, np.array([1.0, np.nan]), 1)
