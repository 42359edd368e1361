"""Smoke test of ``benchmarks/bench_packing.py`` on a tiny model: one off/on pair at 1 × 2 rows; the two updates
agree (the shared-prompt forward is exact to float rounding)."""

from __future__ import annotations

import json


def test_one_pair_on_a_tiny_model(tiny_llama, bench):
    proc = bench("bench_packing.py", "--model", tiny_llama, "--sizes", "1x2", "--reps", "1")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["size"] == "1x2" and 0 < r["prompt_tokens"] < r["tokens"]
    assert len(r["cpu_s"]["off"]) == len(r["cpu_s"]["on"]) == 1
    assert r["dtheta_cosine"] > 0.99
