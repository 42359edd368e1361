"""``benchmarks/specialists.py``: subsets checked, the specialist and union configs built from the union config, the
analysis of run_collab cells worked by hand, and the specialize stage end to end on the tiny task pair (two
``hacrl-fed simulate`` runs, each site alone on its task, exported; the union config names the exports)."""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import specialists as sp  # noqa: E402

UNION = {"run": {"steps": 20, "seed": 0, "run_id": "u", "data": {
    "source": "reasoning_gym", "num_problems": 3000, "eval_size": 32,
    "tasks": [{"name": "chain_sum", "label": "cs"}, {"name": "products"}, {"name": "basic_arithmetic"},
              {"name": "decimal_chain_sum"}],
    "eval_tasks": [{"name": "leg_counting"}]}},
    "agents": [{"name": "a", "algo": {"name": "hacpo", "kl_coef": 0.0}, "model": {"name_or_path": "m"}},
               {"name": "b", "algo": {"name": "hacpo"}, "model": {"name_or_path": "m"}}]}


def test_subsets_are_checked():
    agents, tasks = ["a", "b"], ["cs", "products"]
    assert sp.parse_subsets(["a=cs", "b= products ,"], agents, tasks) == {"a": ["cs"], "b": ["products"]}
    for bad, says in ((["a=cs"], "missing for agent"), (["a=cs", "c=products"], "no agent 'c'"),
                      (["a=cs", "a=products", "b=cs"], "given twice"), (["a=", "b=cs"], "no task"),
                      (["a=chain_sum", "b=cs"], "not among"), (["a=cs,cs", "b=cs"], "task given twice"),
                      (["acs", "b=cs"], "NAME=TASK")):
        with pytest.raises(ValueError, match=says):
            sp.parse_subsets(bad, agents, tasks)


def test_a_specialist_trains_its_subset_alone_and_is_evaluated_on_the_rest():
    cfg = sp.specialist_config(UNION, "b", ["products", "decimal_chain_sum"], steps=5, seed=3)
    data = cfg["run"]["data"]
    assert [t["name"] for t in data["tasks"]] == ["products", "decimal_chain_sum"]
    assert [t["name"] for t in data["eval_tasks"]] == ["chain_sum", "basic_arithmetic", "leg_counting"]
    assert data["num_problems"] == 1500                            # the union's items per task kept
    assert (cfg["run"]["steps"], cfg["run"]["seed"], cfg["run"]["run_id"], cfg["run"]["min_agents"]) == (
        5, 3, "specialist-b", 1)
    assert [a["name"] for a in cfg["agents"]] == ["b"] and cfg["agents"][0]["algo"] == {"name": "gspo"}
    assert UNION["agents"][1]["algo"] == {"name": "hacpo"} and len(UNION["run"]["data"]["tasks"]) == 4  # unchanged
    u = sp.union_config(UNION, {"a": "runs/x/a/export", "b": "runs/x/b/export"})
    assert [a["model"]["name_or_path"] for a in u["agents"]] == ["runs/x/a/export", "runs/x/b/export"]
    assert u["agents"][0]["algo"] == {"name": "hacpo", "kl_coef": 0.0}


def _cell(recipe: str, seed: int, outcomes: dict[str, dict[str, str]]) -> dict:
    return {"recipe": recipe, "seed": seed, "after": {a: {"held_out": o} for a, o in outcomes.items()}}


def test_the_analysis_pairs_by_seed_and_item(tmp_path):
    """Two sites, tasks x (a's) and y (b's), two items each. Site a, on y: the specialist right on 0 of 2; GSPO right
    on y0 at both seeds; hacpo right on y0 and y1 at both seeds → differences [[0, 1], [0, 1]]: +50 points at each
    seed. By hand (two-way model, hacrl_fed.report.stats): MS_seed = 0, MS_item = 2 · (0.25 + 0.25) / 1 = 1,
    MS_resid = 0 → σ²_problem = 0.5, σ²_seed = σ²_resid = 0; Var(mean) = 0.5 / 2 = 0.25, se 0.5; t(0.975, 1 df)
    = 12.706 → 0.5 ± 6.353: the items are a sample too, and two of them say little."""
    ok, no = "correct", "wrong_answer"
    ids = {"x0": "x", "x1": "x", "y0": "y", "y1": "y"}
    collab = tmp_path / "collab"
    (collab / "cells").mkdir(parents=True)
    (collab / "meta.json").write_text(json.dumps({"command": "c", "tasks": ids}))
    (collab / "before.json").write_text(json.dumps({"agents": {
        "a": {"held_out": {"x0": ok, "x1": ok, "y0": no, "y1": no}},
        "b": {"held_out": {"x0": no, "x1": no, "y0": ok, "y1": no}}}}))
    for s in (0, 1):
        gspo = {"a": {"x0": ok, "x1": ok, "y0": ok, "y1": no}, "b": {"x0": no, "x1": no, "y0": ok, "y1": ok}}
        hacpo = {"a": {"x0": ok, "x1": ok, "y0": ok, "y1": ok}, "b": {"x0": ok, "x1": no, "y0": ok, "y1": ok}}
        for r, o in (("gspo", gspo), ("hacpo", hacpo)):
            (collab / "cells" / f"{r}-s{s}.json").write_text(json.dumps(_cell(r, s, o)))
    out = tmp_path / "out"
    out.mkdir()
    (out / "specialists.json").write_text(json.dumps({"command": "s", "subsets": {"a": ["x"], "b": ["y"]}}))
    text = sp.analyse(collab, out)
    rec = json.loads((out / "analysis.json").read_text())["sites"]
    a_other, b_other = rec["a"]["other"], rec["b"]["other"]
    assert (a_other["tasks"], a_other["items"], a_other["specialist"]) == (["y"], 2, 0.0)
    assert (a_other["gspo"], a_other["hacpo"]) == (0.5, 1.0)
    d = a_other["hacpo - gspo"]
    assert (d["mean"], d["seeds"], d["items"]) == (0.5, 2, 2)
    assert (d["low"], d["high"]) == pytest.approx((0.5 - 6.3531, 0.5 + 6.3531), abs=1e-4)
    assert b_other["hacpo - gspo"]["mean"] == 0.5 and rec["b"]["own"]["hacpo - gspo"]["mean"] == 0.0
    assert "hacpo - gspo_x2" not in a_other                                   # no GSPO×2 cells: no contrast
    assert d["mde"] > 1 and "| a | other: y | 2 | 0.0 % | 50.0 % | 100.0 % | +50.0 [-585.3, +685.3], MDE " in text


def test_the_specialize_stage_on_the_tiny_task_pair(tmp_path):
    """Each tiny site alone on its task (1 step), exported; ``union.toml`` is a valid simulate config naming the
    exports; ``specialists.json`` records the subsets and each run's per-task table; a second call reuses them."""
    env = dict(os.environ, HACRL_FED_CACHE=str(tmp_path / "cache"))
    args = ["--config", str(ROOT / "examples" / "tiny_tasks.toml"), "--subset", "llama-bpe=chain_sum",
            "--subset", "gemma-unigram=spell_backward", "--steps", "1", "--work", str(tmp_path / "work"),
            "--out", str(tmp_path / "out")]
    import subprocess

    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "specialists.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.loads((tmp_path / "out" / "specialists.json").read_text())
    assert rec["subsets"] == {"llama-bpe": ["chain_sum"], "gemma-unigram": ["spell_backward"]}
    for agent, spec in rec["specialists"].items():
        export = Path(spec["export"])
        assert (export / "config.json").is_file() and (export / "hacrl_fed_prompt.json").is_file()
        assert {"chain_sum", "spell_backward"} <= set(spec["tasks"])      # own task trained, the other evaluated
        run_cfg = tomllib.loads((tmp_path / "work" / "configs" / f"{agent}.toml").read_text())
        assert [a["name"] for a in run_cfg["agents"]] == [agent]
    union = tomllib.loads((tmp_path / "out" / "union.toml").read_text())
    assert {a["name"]: a["model"]["name_or_path"] for a in union["agents"]} == {
        a: s["export"] for a, s in rec["specialists"].items()}
    again = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "specialists.py"), *args], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("exported already") == 2


def test_bad_arguments_are_refused(tmp_path):
    import subprocess

    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "specialists.py"), "--config",
                           str(ROOT / "examples" / "tiny_tasks.toml"), "--subset", "llama-bpe=nope", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not among the config's tasks" in proc.stderr
