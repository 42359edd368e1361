"""The collaboration benchmark on a task suite, end to end with the tiny models: per-task results, outcomes per
problem (format vs content), the noise section (paired comparisons through hacrl_fed.report.stats), resumable
cells."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(out: Path, *extra: str) -> str:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "run_collab.py"), "--pair", "tiny-tasks", "--seeds", "2",
           "--steps", "1", "--recipes", "gspo,hacpo_cross_family_task", "--out", str(out), *extra]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout


def test_task_suite_benchmark_reports_per_task_and_resumes(tmp_path):
    out = tmp_path / "collab"
    first = _run(out)
    progress = [line for line in first.splitlines() if " step 1/1, " in line]   # one line per step of a cell
    assert len(progress) == 4 and progress[0].startswith("[gspo s0] step 1/1, ") and "left): rollouts right" in progress[0]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["eval_sets"] == ["held_out", "families"]
    assert set(meta["tasks"].values()) == {"chain_sum", "spell_backward", "leg_counting"}
    cell = json.loads((out / "cells" / "hacpo_cross_family_task-s1.json").read_text())
    outcomes = {v for per in cell["after"].values() for s in per.values() for v in s.values()}
    for agent, sets in cell["after"].items():   # every evaluated response is kept beside its outcome, bounded
        for e, per in sets.items():
            texts = cell["responses"][agent][e]
            assert set(texts) == set(per) and all(isinstance(t, str) and len(t) <= 400 for t in texts.values())
    before = json.loads((out / "before.json").read_text())
    assert set(before["responses"]["llama-bpe"]["families"]) == set(before["agents"]["llama-bpe"]["families"])
    assert outcomes <= {"correct", "truncated", "no_answer", "wrong_answer", "verifier_error"} and outcomes
    summary = json.loads((out / "results.json").read_text())
    rec = summary["recipes"]["hacpo_cross_family_task"]["agents"]["llama-bpe"]
    assert set(rec["tasks"]) == {"chain_sum", "spell_backward", "leg_counting"}
    assert rec["tasks"]["leg_counting"]["set"] == "families" and rec["tasks"]["chain_sum"]["set"] == "held_out"
    assert set(rec["held_out"]["gains"]) == {"format_fixed", "content_fixed", "format_broken", "content_broken"}
    mix = rec["tasks"]["leg_counting"]["outcomes"]    # what the family's answers are: right, wrong, cut, none
    assert set(mix) == {"correct", "wrong_answer", "truncated", "no_answer", "verifier_error"}
    assert abs(sum(mix.values()) - 1) < 1e-9 and abs(mix["correct"] - rec["tasks"]["leg_counting"]["mean"]) < 1e-9
    assert rec["held_out"]["mde_vs_gspo"]["seeds"] == 2   # the noise section: paired by seed and problem
    for section in ("## Noise and minimum detectable effect", "## Held-out task families", "## Per task",
                    "## Format or content", "## Does an agent gain most where its peer is stronger?",
                    "## Outcomes on the held-out task families", "## Own rows that carried a gradient"):
        assert section in first
    again = _run(out)
    assert again.count("done already") == 4
    assert json.loads((out / "meta.json").read_text())["engines"] == {"llama-bpe": "hf", "gemma-unigram": "hf"}
    other = "loop"
    mixed = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_collab.py"), "--pair", "tiny-tasks",
                            "--seeds", "3", "--steps", "1", "--recipes", "gspo", "--engine", other, "--out", str(out)],
                           capture_output=True, text=True, cwd=ROOT)
    assert mixed.returncode == 2 and "engines are never mixed" in mixed.stderr
    assert not (out / "cells" / "gspo-s2.json").exists()


def test_engines_are_chosen_as_requested_as_recorded_or_as_configured(tmp_path):
    """``--engine`` wins (``auto`` resolved to the engine that runs); a directory holding results (a cell or
    before.json) keeps its recorded engines; else the config's engine."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import pytest
    from collab.results import choose_engines

    from hacrl_fed.config import SimulateConfig, load_config
    from hacrl_fed.worker.engines import resolve_engine

    cfg = load_config(ROOT / "examples" / "tiny_tasks.toml", SimulateConfig)
    names = [a.name for a in cfg.agents]
    meta = tmp_path / "meta.json"
    auto = resolve_engine("auto")
    assert choose_engines(meta, cfg, None) == dict.fromkeys(names, "hf")            # nothing there: the config's
    assert choose_engines(meta, cfg, "loop") == dict.fromkeys(names, "loop")
    assert choose_engines(meta, cfg, "auto") == dict.fromkeys(names, auto)
    meta.write_text(json.dumps({"engines": dict.fromkeys(names, "loop")}))
    assert choose_engines(meta, cfg, None) == dict.fromkeys(names, "hf")            # meta.json alone: no results
    (tmp_path / "before.json").write_text("{}")
    assert choose_engines(meta, cfg, None) == dict.fromkeys(names, "loop")          # results: as recorded
    assert choose_engines(meta, cfg, "hf") == dict.fromkeys(names, "hf")            # check_engines refuses it later
    meta.write_text(json.dumps({"command": "made before engines were recorded"}))
    assert choose_engines(meta, cfg, None) == dict.fromkeys(names, "hf")            # the config's, as then
    (tmp_path / "before.json").unlink()
    cfg.agents[0].model = cfg.agents[0].model.model_copy(update={"engine": "loop"})  # as a config naming one
    assert choose_engines(meta, cfg, None) == {names[0]: "loop", names[1]: "hf"}
    with pytest.raises(ValueError, match="unknown rollout engine 'nope'"):
        choose_engines(meta, cfg, "nope")


def _cells(table: list[list[int]]) -> list[dict]:
    """One cell per seed (row), one problem per column, right where the entry is 1."""
    return [{"seed": s, "after": {"a": {"held_out": {f"p{i}": bool(x) for i, x in enumerate(row)}}}}
            for s, row in enumerate(table)]


def test_paired_interval_is_t_on_the_seeds_of_the_two_way_model():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from run_collab import paired_interval

    # differences A − B = [[1, 1, 1], [0, 0, 1]] (B never right): mean 4/6; the two-way model gives σ²_seed = 1/6,
    # σ²_problem = 0, σ²_resid = 1/6 (tests/report/test_stats.py, table 2), Var(mean) = 1/12 + 1/36 = 1/9, so the
    # 95 % interval is 2/3 ± t_{0.975, 1} · 1/3 = 0.6667 ± 4.2354
    a, b = _cells([[1, 1, 1], [0, 0, 1]]), _cells([[0, 0, 0], [0, 0, 0]])
    mean, lo, hi = paired_interval(a, b, "a", "held_out")
    assert abs(mean - 2 / 3) < 1e-12 and abs(lo - (2 / 3 - 4.2354)) < 1e-3 and abs(hi - (2 / 3 + 4.2354)) < 1e-3
    one = paired_interval(a[:1], b, "a", "held_out")   # one seed: the mean, no interval
    assert one == (1.0, None, None)


def test_paired_mde_gives_the_components_and_the_seeds_for_five_points():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from hacrl_fed.report import stats
    from run_collab import paired_mde

    a, b = _cells([[1, 1, 1], [0, 0, 1]]), _cells([[0, 0, 0], [0, 0, 0]])
    got = paired_mde(a, b, "a", "held_out")
    assert (got["seeds"], got["problems"]) == (2, 3)
    assert abs(got["sd_seed"] - (1 / 6) ** 0.5) < 1e-9 and got["sd_problem"] == 0.0
    assert abs(got["sd_resid"] - (1 / 6) ** 0.5) < 1e-9 and got["floor"] == 0.0
    assert abs(got["mde"] - (12.7062 + 1.3764) / 3) < 1e-3      # (t_{0.975,1} + t_{0.8,1}) · SE, SE = 1/3
    c = stats.variance_components([[1, 1, 1], [0, 0, 1]])
    n = got["seeds_for_5_points"]
    assert stats.mde(c, n, 3) <= 0.05 < stats.mde(c, n - 1, 3)
    assert paired_mde(a[:1], b, "a", "held_out")["mde"] is None


def test_a_named_option_is_compared_with_the_same_recipe_without_it(tmp_path):
    """Capability per task (``hacpo_cross_family_task``) against global capability (``hacpo_cross_family``),
    on the committed task-suite cells: the difference isolates the option."""
    import shutil

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from run_collab import paired_interval, summarize

    out = tmp_path / "collab-tasks"
    shutil.copytree(ROOT / "benchmarks" / "results" / "collab-tasks", out)
    summary = summarize(out)
    cells = {r: sorted((json.loads(p.read_text()) for p in (out / "cells").glob(f"{r}-s*.json")),
                       key=lambda c: c["seed"]) for r in ("hacpo_cross_family_task", "hacpo_cross_family")}
    got = summary["recipes"]["hacpo_cross_family_task"]["agents"]["smollm2"]["held_out"]["vs"]["hacpo_cross_family"]
    assert got == paired_interval(cells["hacpo_cross_family_task"], cells["hacpo_cross_family"], "smollm2", "held_out")
    assert "hacpo_cross_family_task" not in summary["recipes"]["hacpo_cross_family"]["agents"]["smollm2"]["held_out"]["vs"]
    assert "| HACPO cross-family, capability per task − HACPO cross-family |" in (out / "results.md").read_text()


def test_a_named_option_with_the_contributor_is_compared_with_its_twin_with_the_contributor(tmp_path):
    """``hacpo_cross_family_distill+contrib`` − ``hacpo_cross_family+contrib`` (the families pre-registration's
    primary contrast): paired by seed and problem, per evaluation set and per task, in results.json and
    results.md. The option's cells here are the committed ``+contrib`` cells with 6 held-out answers of smollm2 per
    seed turned right, so the difference is known."""
    import shutil

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from run_collab import paired_interval, summarize

    out = tmp_path / "collab-tasks"
    shutil.copytree(ROOT / "benchmarks" / "results" / "collab-tasks", out)
    base = sorted((json.loads(p.read_text()) for p in (out / "cells").glob("hacpo_cross_family+contrib-s*.json")),
                  key=lambda c: c["seed"])
    flipped = []
    for cell in base:
        cell = json.loads(json.dumps(cell))
        cell["recipe"] = "hacpo_cross_family_distill+contrib"
        held = cell["after"]["smollm2"]["held_out"]
        wrong = [p for p in sorted(held) if held[p] != "correct"][:6]
        for p in wrong:
            held[p] = "correct"
        flipped.append(len(wrong))
        (out / "cells" / f"hacpo_cross_family_distill+contrib-s{cell['seed']}.json").write_text(json.dumps(cell))
    summary = summarize(out)
    cells = {r: sorted((json.loads(p.read_text()) for p in (out / "cells").glob(f"{r}-s*.json")),
                       key=lambda c: c["seed"])
             for r in ("hacpo_cross_family_distill+contrib", "hacpo_cross_family+contrib")}
    rec = summary["recipes"]["hacpo_cross_family_distill+contrib"]["agents"]
    got = rec["smollm2"]["held_out"]["vs_twin_with_contrib"]
    assert got == paired_interval(cells["hacpo_cross_family_distill+contrib"], cells["hacpo_cross_family+contrib"],
                                  "smollm2", "held_out")
    m = len(base[0]["after"]["smollm2"]["held_out"])
    assert abs(got[0] - sum(flipped) / len(flipped) / m) < 1e-12 and got[1] is not None   # two seeds: an interval
    assert rec["gemma3"]["held_out"]["vs_twin_with_contrib"][0] == 0.0                     # gemma3 unchanged
    assert rec["smollm2"]["held_out"]["mde_vs_twin_with_contrib"]["seeds"] == 2
    per_task = [t["vs_twin_with_contrib"][0] for t in rec["smollm2"]["tasks"].values() if t["set"] == "held_out"]
    assert all(d >= 0 for d in per_task) and max(per_task) > 0
    assert "vs_twin_with_contrib" not in summary["recipes"]["hacpo_cross_family+contrib"]["agents"]["smollm2"]["held_out"]
    md = (out / "results.md").read_text()
    row = ("| HACPO cross-family + peer distillation + contributor − HACPO cross-family + contributor | ")
    assert md.count(row) == 2 and "MDE" in md.split(row)[1].splitlines()[0]   # per set (with MDE) and per task


def test_own_gradient_counts_rows_and_updates_that_carried_a_gradient():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from run_collab import own_gradient

    def step(acc: float, frac: float, updates: int, zero: int) -> dict:
        return {"accuracy": acc, "own_grad_frac": frac, "updates": updates, "zero_grad_updates": zero, "peers": {}}

    seed0 = {"per_step": {"a": [step(0.0, 0.0, 2, 2), step(0.25, 0.5, 2, 0)]}}
    seed1 = {"per_step": {"a": [step(0.5, 1.0, 2, 1), step(0.0, 0.0, 2, 2)]}}
    got = own_gradient([seed0, seed1], "a")
    assert got == {"rollout_accuracy": 0.1875, "own_grad_frac": 0.375, "updates": 8, "updates_with_grad": 3}
    assert own_gradient([{"per_step": {"a": [{"accuracy": 0.0, "own_grad_frac": None, "peers": {}}]}}], "a") is None


def test_the_iqm_view_is_paired_by_seed_and_stratified_by_task():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from collab.stats import iqm_vs

    tasks = {"t1": {"p0", "p1"}, "t2": {"p2", "p3"}}
    # both seeds alike: task accuracies [[1.0, 0.5], [1.0, 0.5]] against all 0; the IQM of 0.5 0.5 1 1 cuts one
    # value at each end: mean(0.5, 1) = 0.75; every resample is the same table, so the interval is the point
    a, b = _cells([[1, 1, 0, 1], [1, 1, 1, 0]]), _cells([[0, 0, 0, 0], [0, 0, 0, 0]])
    got = iqm_vs(a, b, "a", "held_out", tasks, reps=200)
    assert (got["seeds"], got["tasks"]) == (2, 2) and got["iqm"] == 0.75 and got["iqm_base"] == 0.0
    assert got["diff"] == (0.75, 0.75, 0.75)
    assert iqm_vs(a[:1], b, "a", "held_out", tasks) is None   # one seed: no bootstrap over seeds
