"""benchmarks/task_baseline.py: the share of groups that carry a gradient, alone and joint, and its table;
pass@k (Chen et al. 2021, eq. 1) on hand-worked items, its columns and the headroom rule; ``--samples`` bounds and
settings; a smoke run of the script on the two tiny models with 16 samples."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import task_baseline as bench  # noqa: E402


def test_a_group_carries_a_gradient_only_when_its_rewards_differ():
    own = {"p0": 0, "p1": 1, "p2": 4, "p3": 3}
    assert bench.signal_share(own) == 0.5
    assert bench.signal_share({"p0": 0, "p1": 0}) == 0.0
    assert bench.signal_share({}) == 0.0
    assert bench.signal_share({"p0": 1}, samples=1) == 0.0


def test_the_joint_group_has_a_gradient_where_either_agent_is_right_some_of_the_time():
    alone = {"p0": 0, "p1": 0, "p2": 0, "p3": 4}
    peer = {"p0": 2, "p1": 0, "p2": 4, "p3": 4}
    assert bench.signal_share(alone) == 0.0
    # p0: 0 + 2 of 8, p2: 0 + 4 of 8 are mixed; p1 all wrong; p3 all right
    assert bench.signal_share(alone, peer) == 0.5
    # a problem only one agent answered counts as all wrong for the other
    assert bench.signal_share({"p0": 4}, {"p1": 1}) == 1.0


def test_pass_at_k_on_hand_worked_items():
    # n = 4 samples, c = 1 right, k = 2: 1 - C(3, 2) / C(4, 2) = 1 - 3/6
    assert bench.pass_at_k(4, 1, 2) == 0.5
    # k = 1 is the item's accuracy c / n
    assert bench.pass_at_k(4, 1, 1) == 0.25 and bench.pass_at_k(16, 6, 1) == 6 / 16
    # n = 16, c = 2, k = 4: 1 - C(14, 4) / C(16, 4) = 1 - 1001/1820
    assert bench.pass_at_k(16, 2, 4) == pytest.approx(1 - 1001 / 1820)
    # one right of 16 and k = 16 samples: the right one is always drawn; none right: never
    assert bench.pass_at_k(16, 1, 16) == 1.0 and bench.pass_at_k(16, 0, 16) == 0.0
    # n - c < k: every draw of k holds a right one
    assert bench.pass_at_k(4, 3, 2) == 1.0
    for n, c, k in ((4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)):
        with pytest.raises(ValueError):
            bench.pass_at_k(n, c, k)


def test_pass_at_k_is_monotone_in_k_and_in_c_and_bounded():
    for n in (1, 3, 4, 16):
        for c in range(n + 1):
            vals = [bench.pass_at_k(n, c, k) for k in range(1, n + 1)]
            assert all(0.0 <= v <= 1.0 for v in vals)
            assert vals == sorted(vals) and vals[0] == pytest.approx(c / n)
            assert vals[-1] == (1.0 if c else 0.0)
            if c < n:
                assert all(bench.pass_at_k(n, c, k) <= bench.pass_at_k(n, c + 1, k) for k in range(1, n + 1))
    # the estimator is the exact hypergeometric probability: against a brute count for n = 4, c = 2, k = 2
    from itertools import combinations
    draws = list(combinations([1, 1, 0, 0], 2))
    assert bench.pass_at_k(4, 2, 2) == sum(any(d) for d in draws) / math.comb(4, 2)


def test_task_pass_at_k_is_the_mean_over_items():
    correct = {"a": 1, "b": 0, "c": 4, "d": 2}
    # items: 1 - C(3,2)/6 = .5, 0, 1, 1 - C(2,2)/6 = 5/6
    assert bench.task_pass_at_k(correct, 4, 2) == pytest.approx((0.5 + 0 + 1 + 5 / 6) / 4)
    assert bench.task_pass_at_k(correct, 4, 1) == pytest.approx(7 / 16)
    assert bench.task_pass_at_k({}, 4, 2) == 0.0
    # a cell reports the k of PASS_KS up to its samples; old cells carry 4
    assert set(bench.cell_pass_at({"correct": correct, "samples": 4})) == {1, 4}
    assert set(bench.cell_pass_at({"correct": correct})) == {1, 4}
    assert set(bench.cell_pass_at({"correct": {"a": 3}, "samples": 3})) == {1}
    assert set(bench.cell_pass_at({"correct": {"a": 3}, "samples": 16})) == {1, 4, 16}


def _cell(agent: str, label: str, correct: dict[str, int], samples: int = 4, greedy: float = 0.0) -> dict:
    return {"agent": agent, "label": label, "generator": label.rsplit("-", 1)[0], "config": {},
            "problems": len(correct),
            "greedy": {"accuracy": greedy, "correct": {k: 0 for k in correct}, "samples": 1, "outcomes": {}},
            "sampled": {"accuracy": sum(correct.values()) / (samples * len(correct)), "correct": correct,
                        "samples": samples, "outcomes": {}}}


def test_headroom_needs_a_right_sample_and_no_solved_task():
    assert bench.headroom(_cell("a", "chain_sum-l1", {"p0": 1, "p1": 0}, samples=16)) is True
    assert bench.headroom(_cell("a", "chain_sum-l1", {"p0": 0, "p1": 0}, samples=16)) is False
    # solved greedily or sampled: no headroom
    assert bench.headroom(_cell("a", "chain_sum-l1", {"p0": 1, "p1": 0}, samples=16, greedy=0.6)) is False
    assert bench.headroom(_cell("a", "chain_sum-l1", {"p0": 16, "p1": 4}, samples=16)) is False
    # fewer than 16 samples: a right one decides yes, none leaves it undecided
    assert bench.headroom(_cell("a", "chain_sum-l1", {"p0": 1, "p1": 0})) is True
    assert bench.headroom(_cell("a", "chain_sum-l1", {"p0": 0, "p1": 0})) is None


def test_summary_writes_the_signal_table_only_for_tasks_both_agents_have(tmp_path: Path):
    (tmp_path / "cells").mkdir()
    (tmp_path / "meta.json").write_text(json.dumps({"commands": ["x"], "system_prompt": "s", "max_new_tokens": 8}))
    cells = [_cell("gemma3", "chain_sum-l1", {"a": 0, "b": 0}), _cell("smollm2", "chain_sum-l1", {"a": 1, "b": 0}),
             _cell("smollm2", "products-l1", {"a": 2, "b": 2})]
    for c in cells:
        (tmp_path / "cells" / f"{c['agent']}--{c['label']}.json").write_text(json.dumps(c))
    bench.summarize(tmp_path)
    md = (tmp_path / "results.md").read_text()
    table = md.split("## Groups that carry a gradient")[1]
    assert "| task | gemma3 alone | smollm2 alone | joint |" in table
    assert "| chain_sum-l1 | 0 | 50 | 50 |" in table
    assert "products-l1" not in table


def _write(tmp_path: Path, cells: list[dict], **meta) -> None:
    (tmp_path / "cells").mkdir()
    (tmp_path / "meta.json").write_text(json.dumps({"commands": ["x"], "system_prompt": "s", "max_new_tokens": 8,
                                                    **meta}))
    for c in cells:
        (tmp_path / "cells" / f"{c['agent']}--{c['label']}.json").write_text(json.dumps(c))


def test_cells_of_four_samples_still_summarize_with_pass_at_1_and_4(tmp_path: Path):
    _write(tmp_path, [_cell("gemma3", "chain_sum-l1", {"a": 1, "b": 0}),
                      _cell("smollm2", "chain_sum-l1", {"a": 0, "b": 0})])
    summary = bench.summarize(tmp_path)
    g = summary["cells"]["gemma3--chain_sum-l1"]
    assert g["samples"] == 4 and set(g["pass_at"]) == {"1", "4"}
    assert g["pass_at"]["1"] == g["sampled"] == 1 / 8 and g["pass_at"]["4"] == 0.5
    assert g["headroom"] is True and summary["cells"]["smollm2--chain_sum-l1"]["headroom"] is None
    md = (tmp_path / "results.md").read_text()
    assert "gemma3 pass@1 (= avg@4) | gemma3 pass@4 | gemma3 trunc / no box | gemma3 room" in md
    assert "pass@16 |" not in md and "**Headroom**" in md
    assert "| chain_sum-l1 | `{" in md and "| 0.0 | 12.5 | 50.0 | 0 / 0 | yes |" in md
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads(json.dumps(summary))


def test_sixteen_samples_give_pass_at_16_and_the_gradient_table_uses_each_cells_samples(tmp_path: Path):
    sixteen = _cell("gemma3", "chain_sum-l1", {"a": 1, "b": 0, "c": 16}, samples=16)
    four = _cell("smollm2", "chain_sum-l1", {"a": 0, "b": 0, "c": 0})
    _write(tmp_path, [sixteen, four], temperature=0.7, samples=16)
    summary = bench.summarize(tmp_path)
    g = summary["cells"]["gemma3--chain_sum-l1"]
    assert set(g["pass_at"]) == {"1", "4", "16"} and summary["temperature"] == 0.7
    assert g["pass_at"]["1"] <= g["pass_at"]["4"] <= g["pass_at"]["16"] == pytest.approx(2 / 3)
    assert summary["cells"]["smollm2--chain_sum-l1"]["pass_at"] == {"1": 0.0, "4": 0.0}
    md = (tmp_path / "results.md").read_text()
    assert "gemma3 pass@16" in md and "4/16 samples" in md
    # own groups: gemma3 a (1 of 16) mixed; joint group of 20: a (1) and c (16) mixed, b none
    assert "| chain_sum-l1 | 33 | 0 | 67 |" in md.split("## Groups that carry a gradient")[1]


def _script(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "task_baseline.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("k", ["0", "65"])
def test_samples_out_of_bounds_is_refused(tmp_path: Path, k: str):
    proc = _script("--out", str(tmp_path / "o"), "--samples", k, timeout=60)
    assert proc.returncode == 2 and f"--samples must be in 1..64, got {k}" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_smoke_tiny_models_sixteen_samples_then_other_settings_are_refused(tmp_path: Path):
    out = tmp_path / "tb"
    proc = _script("--config", str(ROOT / "examples" / "tiny_tasks.toml"), "--out", str(out), "--tasks",
                   "chain_sum-l1", "--problems", "2", "--max-new-tokens", "8", "--temperature", "0.7",
                   "--samples", "16", "--threads", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["samples"] == 16 and meta["temperature"] == 0.7
    summary = json.loads((out / "results.json").read_text())
    assert set(summary["cells"]) == {"llama-bpe--chain_sum-l1", "gemma-unigram--chain_sum-l1"}
    for name, c in summary["cells"].items():
        cell = json.loads((out / "cells" / f"{name}.json").read_text())
        assert cell["sampled"]["samples"] == 16 and len(cell["sampled"]["correct"]) == 2
        assert all(0 <= v <= 16 for v in cell["sampled"]["correct"].values())
        assert c["samples"] == 16 and set(c["pass_at"]) == {"1", "4", "16"}
        p1, p4, p16 = (c["pass_at"][k] for k in ("1", "4", "16"))
        assert 0.0 <= p1 <= p4 <= p16 <= 1.0 and p1 == pytest.approx(c["sampled"])
        assert c["headroom"] in (True, False)
    md = (out / "results.md").read_text()
    assert "llama-bpe pass@16" in md and "16 samples per item at temperature 0.7" in md
    assert "## Groups that carry a gradient" in md
    # the same directory with another K (or the default 4) is refused, as another temperature is
    for extra in (["--samples", "4"], []):
        proc = _script("--config", str(ROOT / "examples" / "tiny_tasks.toml"), "--out", str(out), "--tasks",
                       "chain_sum-l1", "--problems", "2", "--max-new-tokens", "8", "--temperature", "0.7", *extra,
                       timeout=120)
        assert proc.returncode == 2 and "other settings (samples)" in proc.stderr


def test_a_directory_from_before_the_options_reads_as_temperature_1_and_4_samples(tmp_path: Path):
    out = tmp_path / "old"
    out.mkdir()
    _write(out, [], system_prompt=bench.SYSTEM_PROMPT)     # a meta.json with neither temperature nor samples
    proc = _script("--config", str(ROOT / "examples" / "tiny_tasks.toml"), "--out", str(out), "--max-new-tokens",
                   "8", "--temperature", "0.7", "--samples", "16", timeout=120)
    assert proc.returncode == 2 and "other settings (temperature, samples)" in proc.stderr
