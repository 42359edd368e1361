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
