"""Smoke test of ``benchmarks/bench_logprobs.py`` with a small LM head: every variant runs in its own process and
the chunked and checkpointed log-probs agree with the full log-softmax."""

from __future__ import annotations

import json


def test_variants_agree_with_the_full_log_softmax(bench):
    proc = bench("bench_logprobs.py", "--batch", "2", "--seq", "64", "--hidden", "32", "--vocab", "32768",
                 "--chunks", "16", "--checkpoint-chunks", "16", "--repeats", "1")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["setting"] == {"batch": 2, "seq": 64, "hidden": 32, "vocab": 32768, "repeats": 1}
    assert set(r) >= {"full", "chunked_16", "checkpoint_16"}
    for name in ("chunked_16", "checkpoint_16"):
        assert r[f"{name}/logprob_sum_rel_diff"] < 1e-5
        assert abs(r[name]["head_grad_norm"] - r["full"]["head_grad_norm"]) <= 1e-4 * r["full"]["head_grad_norm"]
        assert r[f"{name}/peak_ratio"] > 0 and r[f"{name}/time_ratio"] > 0
