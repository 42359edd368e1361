"""``route eval``'s comparison, report and router file on synthetic outcomes with a known best answer: two
models, each right on one task only, queries whose wording tells the task."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hacrl_fed.data.problem import Problem
from hacrl_fed.route.embed import Embedder, cosine
from hacrl_fed.route.evaluate import RouteData, compare
from hacrl_fed.route.report import format_table, write_report
from hacrl_fed.route.router import Router
from hacrl_fed.route.run import capability_from_report, split_calibration


def _texts(task: str, n: int, offset: int) -> list[str]:
    if task == "sum":
        return [f"What is {i + offset} plus {2 * i + 1}? Add the numbers." for i in range(n)]
    return [f"A farm has {i + offset} cows and {i + 2} hens. How many legs are there?" for i in range(n)]


def _data(n: int = 20) -> tuple[RouteData, list[str]]:
    """Model 'cheap' (1 parameter) is right on every 'sum' query, model 'big' (3 parameters) on every 'legs'
    query, except one 'sum' query per split that only 'big' gets right."""
    cal_texts = _texts("sum", n, 0) + _texts("legs", n, 0)
    texts = _texts("sum", n, 100) + _texts("legs", n, 100)
    tasks_cal, tasks = ["sum"] * n + ["legs"] * n, ["sum"] * n + ["legs"] * n
    correct = np.array([[1.0] * n + [0.0] * n, [0.0] * n + [1.0] * n])
    correct[:, 0] = [0.0, 1.0]
    emb = Embedder().fit(cal_texts)
    e_cal, e = emb.embed(cal_texts), emb.embed(texts)
    tokens = np.full((2, 2 * n), 10.0)
    seconds = np.array([[0.1] * (2 * n), [0.3] * (2 * n)])
    return RouteData(models=["cheap", "big"], correct_cal=correct.copy(), correct=correct.copy(),
                     tokens_cal=tokens, tokens=tokens, seconds_cal=seconds, seconds=seconds,
                     params=np.array([1.0, 3.0]), tasks_cal=tasks_cal, tasks=tasks, sim=cosine(e, e_cal),
                     sim_cal=cosine(e_cal, e_cal)), cal_texts


def test_routing_beats_the_best_single_model_when_each_model_owns_a_task():
    d, _ = _data()
    r = compare(d, k=3)
    pol = r["policies"]
    # best single: 'big' (21/40 in calibration) → right on the 20 legs queries and the one special sum query
    assert pol["best_single"]["share"] == {"cheap": 0.0, "big": 1.0}
    assert pol["best_single"]["accuracy"] == pytest.approx(21 / 40)
    # the task decides: per task and kNN get 39/40 (the special sum query goes to 'cheap', which misses it)
    assert pol["best_per_task"]["accuracy"] == pytest.approx(39 / 40)
    assert pol["knn"]["accuracy"] == pytest.approx(39 / 40)
    assert pol["knn"]["vs_best_single"] == pytest.approx(18 / 40)
    lo, hi = pol["knn"]["vs_best_single_ci"]
    assert 0 < lo <= 18 / 40 <= hi
    # the oracle answers all 40, sending only what 'cheap' cannot do to 'big'
    assert pol["oracle"]["accuracy"] == 1.0 and pol["oracle"]["share"]["big"] == pytest.approx(21 / 40)
    # random is the mean over models: each query is right for exactly one of the two
    assert pol["random"]["accuracy"] == pytest.approx(0.5)
    # cost: best single always pays 3 × 10 parameter-tokens; kNN sends half the queries to the 1-parameter model
    assert pol["best_single"]["cost"]["param_tokens"] == pytest.approx(30.0)
    assert pol["knn"]["cost"]["param_tokens"] == pytest.approx((20 * 10 + 20 * 30) / 40)
    assert pol["knn"]["cost"]["seconds"] == pytest.approx(0.2)


def test_cost_aware_sweep_and_the_cost_at_which_routing_matches_best_single():
    d, _ = _data()
    r = compare(d, k=3)
    by_target = {s["target"]: s for s in r["cost_aware"]}
    assert by_target[0.0]["accuracy"] == pytest.approx(19 / 40)          # τ = 0: always the cheap model
    assert by_target[0.0]["cost"]["param_tokens"] == pytest.approx(10.0)
    m = r["match"]
    assert m["best_single_accuracy"] == pytest.approx(21 / 40)
    assert m["cheapest_matching_target"] is not None and m["cheapest_matching_target"] > 0
    assert m["cheapest_matching_cost"] < 30.0                              # cheaper than best single
    assert m["calibration_target"] is not None                             # chosen by leave-one-out on calibration
    assert m["calibration_target_accuracy"] >= 21 / 40


def test_report_files_and_table(tmp_path):
    d, _ = _data()
    r = compare(d, k=3)
    files = write_report(r, tmp_path)
    rec = json.loads(files["json"].read_text())
    assert set(rec["policies"]) >= {"best_single", "best_per_task", "knn", "random", "oracle"}
    assert files["png"].read_bytes()[:4] == b"\x89PNG"
    table = format_table(r)
    assert "| knn | 97.5 [" in table and "| best_single | 52.5 [" in table
    assert "matches best single (52.5 %)" in table


def test_capability_from_a_report_routes_per_task(tmp_path):
    d, _ = _data()
    report = {"tasks": {"sum": {"cheap": {"held_out_after": 0.9}, "big": {"held_out_after": 0.1}},
                        "legs": {"cheap": {"held_out_after": 0.0}, "big": {"held_out_after": 0.8}}}}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    caps = capability_from_report(path)
    assert caps == {"sum": {"cheap": 0.9, "big": 0.1}, "legs": {"cheap": 0.0, "big": 0.8}}
    r = compare(d, k=3, capability=caps)
    assert r["policies"]["best_per_task (report)"]["accuracy"] == pytest.approx(39 / 40)


@pytest.mark.parametrize("content", ["{", "[]", json.dumps({"tasks": {"sum": {"a": {"held_out_after": "x"}}}})])
def test_a_bad_report_is_refused_with_one_line(tmp_path, content):
    path = tmp_path / "report.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="report.json") as err:
        capability_from_report(path)
    assert "\n" not in str(err.value)


def test_the_calibration_split_takes_a_share_of_every_task():
    problems = [Problem(f"{t}-{i}", f"{t} {i}", "1", "boxed", t) for t in ("a", "b") for i in range(10)] + \
               [Problem("c-0", "c 0", "1", "boxed", "c")]
    cal, routed = split_calibration(problems, 0.3, seed=1)
    assert sorted(p.source for p in cal) == ["a"] * 3 + ["b"] * 3
    assert not {p.id for p in cal} & {p.id for p in routed} and len(cal) + len(routed) == len(problems)
    assert split_calibration(problems, 0.3, seed=1) == (cal, routed)
    with pytest.raises(ValueError, match="fraction"):
        split_calibration(problems, 1.0, seed=0)


def test_a_router_file_round_trips_and_ranks_by_task(tmp_path):
    d, cal_texts = _data()
    router = Router(models=d.models, texts=cal_texts, tasks=d.tasks_cal, correct=d.correct_cal.tolist(),
                    cost=[10.0, 30.0], k=3)
    path = router.save(tmp_path / "router.json")
    loaded = Router.load(path)
    assert loaded.rank("What is 7 plus 9? Add the numbers.") == ["cheap", "big"]
    assert loaded.rank("A farm has 3 cows and 5 hens. How many legs are there?") == ["big", "cheap"]
    # cost-aware: a target nothing reaches keeps the best prediction first
    assert loaded.rank("A farm has 3 cows and 5 hens. How many legs are there?", target=0.0) == ["cheap", "big"]


@pytest.mark.parametrize("change", [
    {"format": "other"}, {"correct": [[2.0] * 40, [0.0] * 40]}, {"cost": [1.0]}, {"k": 0},
    {"models": ["a", "a"]}, {"texts": []}])
def test_a_bad_router_file_is_refused_with_one_line(tmp_path, change):
    d, cal_texts = _data()
    rec = {"format": "hacrl-fed-router/1", "models": d.models, "texts": cal_texts, "tasks": d.tasks_cal,
           "correct": d.correct_cal.tolist(), "cost": [10.0, 30.0], "k": 3, "embedder": "tfidf"} | change
    path = tmp_path / "router.json"
    path.write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="router.json") as err:
        Router.load(path)
    assert "\n" not in str(err.value)


def test_queries_from_a_run_config_are_its_held_out_problems_with_their_tasks(tmp_path):
    from hacrl_fed.route.run import load_queries

    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    queries = load_queries(root / "examples" / "tasks.toml", eval_size=3)
    tasks = [q.source for q in queries]
    # the four trained tasks' held-out instances and the two held-out families, 3 each
    assert len(queries) == 18 and len(set(tasks)) == 6 and all(tasks.count(t) == 3 for t in set(tasks))
    assert {"leg_counting", "decimal_arithmetic", "chain_sum"} <= set(tasks)
    bad = tmp_path / "bad.toml"
    bad.write_text("[run]\nno_such_key = 1\n")
    with pytest.raises(ValueError, match="no_such_key"):
        load_queries(bad)


def test_a_local_model_embeds_queries_into_unit_rows(tmp_path):
    """``--embedder DIR``: mean-pooled last hidden states of a local model (a tiny one here), L2-normalised."""
    from hacrl_fed.route.embed import load_embedder
    from hacrl_fed.tiny_models import build_tiny_model

    model = build_tiny_model("tiny-llama-bpe", tmp_path / "m")
    emb = load_embedder(str(model)).fit([])
    texts = ["What is 2 plus 3?", "A farm has 4 cows. How many legs?", "What is 2 plus 3?"]
    e = emb.embed(texts)
    assert e.shape[0] == 3 and np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    sim = cosine(e, e)
    assert sim[0, 2] == pytest.approx(1.0, abs=1e-5) and sim[0, 1] < 0.9999
    with pytest.raises(ValueError, match="--embedder"):
        load_embedder(str(tmp_path / "none"))
