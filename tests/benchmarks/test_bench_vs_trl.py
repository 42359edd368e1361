"""Smoke tests of ``benchmarks/bench_vs_trl.py`` on a tiny model: hacrl-fed's side of the step in its own process
(the production worker's generate and train, measured and hashed), and, where TRL is installed (the ``bench``
extra), the whole side-by-side driver: both sides sample the same completions from the same prompt ids."""

from __future__ import annotations

import json

import pytest


def test_the_hacrl_fed_side_of_one_step(tiny_llama, tmp_path, bench):
    result = tmp_path / "hacrl.json"
    params = tmp_path / "hacrl.safetensors"
    bench("bench_vs_trl.py", "--side", "hacrl", "--model-dir", tiny_llama, "--b", "2", "--g", "2",
          "--max-new-tokens", "6", "--result", result, "--save-params", params)
    r = json.loads(result.read_text())
    assert r["side"] == "hacrl" and len(r["rewards"]) == 2 * 2 and set(r["rewards"]) <= {0.0, 1.0}
    assert 0 < r["tokens"] <= 2 * 2 * 6
    assert len(r["completion_hash"]) == len(r["expected_prompt_ids_hash"]) == 64
    assert r["step_cpu_s"] >= r["generate_cpu_s"] > 0 and r["peak_rss_bytes"] > 0
    assert r["grad_norm"] >= 0 and r["updates_applied"] in (0.0, 1.0)
    assert params.stat().st_size > 0


def test_the_driver_needs_trl_and_says_so(tiny_llama, tmp_path, bench):
    try:
        import trl  # noqa: F401
    except ImportError:
        proc = bench("bench_vs_trl.py", "--model", tiny_llama, "--out", tmp_path, check=False)
        assert proc.returncode == 1 and "pip install" in proc.stderr and not (tmp_path / "results.json").exists()
        return
    pytest.skip("TRL is installed: test_side_by_side_with_trl runs the driver")


def test_side_by_side_with_trl(tiny_llama, tmp_path, bench):
    pytest.importorskip("trl")
    out = tmp_path / "vs-trl"
    bench("bench_vs_trl.py", "--model", tiny_llama, "--sizes", "1x2", "--reps", "1", "--max-new-tokens", "6",
          "--out", out, timeout=600)
    results = json.loads((out / "results.json").read_text())
    (size,) = results["sizes"]
    assert "failed" not in size, size
    assert size["same_prompts"] and size["same_completions"] and size["same_rewards"]
    assert (out / "results.md").read_text().startswith("# hacrl-fed vs TRL")
