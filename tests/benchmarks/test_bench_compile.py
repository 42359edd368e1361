"""Smoke test of ``benchmarks/bench_compile.py`` on a tiny model: the dynamic and the static KV cache give the same
greedy tokens and both are timed (the compiled variant is left out: it compiles for minutes)."""

from __future__ import annotations

import json


def test_dynamic_and_static_cache_on_a_tiny_model(tiny_llama, bench):
    proc = bench("bench_compile.py", "--model", tiny_llama, "--prompts", "3", "--max-new-tokens", "4", "--no-compile")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (r["rows"], r["new_tokens"], r["threads"]) == (3, 4, 1)
    assert r["static_same_tokens"] is True and "static_compiled_s" not in r
    assert r["dynamic_s"] > 0 and r["static_s"] > 0 and r["dynamic_again_s"] > 0
