"""Smoke test of ``benchmarks/bench_generation.py`` on a tiny model: both sides generate, the JSON line counts
their tokens and gives the rate ratio."""

from __future__ import annotations

import json


def test_batched_and_per_sample_on_a_tiny_model(tiny_llama, bench):
    proc = bench("bench_generation.py", "--model", tiny_llama, "--prompts", "3", "--max-new-tokens", "5")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["prompts"] == 3 and r["max_new_tokens"] == 5 and r["device"] == "cpu"
    for side in ("batched", "per_sample"):
        assert 0 < r[f"{side}_tokens"] <= 3 * 5 and r[f"{side}_s"] >= 0
    assert r["speedup"] > 0


def test_two_engines_side_by_side_on_a_tiny_model(tiny_llama, bench):
    proc = bench("bench_generation.py", "--engines", "hf", "loop", "--model", tiny_llama, "--prompts", "2",
                 "--max-new-tokens", "4", "--temperature", "0", "--reps", "2", "--threads", "1", "--markdown")
    lines = proc.stdout.strip().splitlines()
    r = json.loads(lines[0])
    assert (r["sequences"], r["max_new_tokens"], r["temperature"], r["pairs"]) == (2, 4, 0.0, 2)
    assert r["hf_tokens"] == r["loop_tokens"] and all(0 < t <= 2 * 4 for t in r["hf_tokens"])   # greedy: same tokens
    assert r["ratio_min"] <= r["ratio"] <= r["ratio_max"] and r["cpu_ratio"] > 0
    assert set(r["hf_parts_s"]) == {"prefill", "decode", "logprobs", "rest"} and r["hf_parts_s"]["prefill"] > 0
    # a decode forward runs only when some row outlives its first token (a random tiny model may end both at once)
    assert (r["hf_parts_s"]["decode"] > 0) == any(t > 2 for t in r["hf_tokens"])
    assert r["loop_parts_s"]["logprobs"] == 0 and any(line.startswith("| ") and "×" in line for line in lines[1:])


def test_an_engine_with_its_own_weights_side_by_side(tiny_llama, bench):
    """``ct2`` is built through the registry: float32 greedy gives hf's tokens, no prefill / decode split ("–"), its
    training-model forwards are the behaviour log-probs, its one refresh (the warm-up's conversion) is listed."""
    proc = bench("bench_generation.py", "--engines", "hf", "ct2", "--engine-options", '{"compute_type": "float32"}',
                 "--model", tiny_llama, "--prompts", "2", "--max-new-tokens", "4", "--temperature", "0", "--reps", "1",
                 "--threads", "1", "--markdown")
    lines = proc.stdout.strip().splitlines()
    r = json.loads(lines[0])
    assert r["hf_tokens"] == r["ct2_tokens"] and len(r["ct2_refresh_s"]) == 1
    assert r["ct2_parts_s"]["prefill"] is None and r["ct2_parts_s"]["decode"] is None
    assert r["ct2_parts_s"]["logprobs"] >= 0 and r["ct2_parts_s"]["rest"] >= 0 and r["hf_parts_s"]["prefill"] > 0
    assert any(line.startswith("| ") and "| – / – / " in line for line in lines[1:])


def test_no_logprobs_generates_as_an_evaluation(tiny_llama, bench):
    """``--no-logprobs``: the same greedy tokens, and an engine with its own weights runs no training-model forward."""
    proc = bench("bench_generation.py", "--engines", "hf", "ct2", "--model", tiny_llama, "--prompts", "2",
                 "--max-new-tokens", "4", "--temperature", "0", "--reps", "1", "--threads", "1", "--no-logprobs")
    r = json.loads(proc.stdout.strip().splitlines()[0])
    assert r["logprobs"] is False and r["hf_tokens"] == r["ct2_tokens"]
    assert r["ct2_parts_s"]["logprobs"] == 0 and r["ct2_parts_s"]["rest"] >= 0      # no training-model forward
