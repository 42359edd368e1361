"""Smoke test of ``benchmarks/bench_behaviour_logprobs.py`` on a tiny model: both precisions are measured, the
file is written, and in float32 the generation pass's behaviour log-probs match the teacher-forced pass and the
trainer's forward to float rounding (what the benchmark exists to check)."""

from __future__ import annotations

import json


def test_both_precisions_on_a_tiny_model(tiny_llama, tmp_path, bench):
    out = tmp_path / "behaviour"
    bench("bench_behaviour_logprobs.py", "--model", tiny_llama, "--prompts", "2", "--samples", "2",
          "--max-new-tokens", "6", "--out", out)
    (path,) = out.glob("*.json")
    result = json.loads(path.read_text())
    assert result["prompts"] == 2 and result["samples"] == 2
    for name in ("float32", "bf16_autocast"):
        r = result[name]
        assert 0 < r["tokens"] <= 2 * 2 * 6
        assert r["generate_cpu_s"]["generation"] > 0 and r["generate_cpu_s"]["teacher_forced"] > 0
    fp32 = result["float32"]
    for pair in ("generation_vs_teacher_forced", "generation_vs_trainer", "teacher_forced_vs_trainer"):
        assert fp32[pair]["token_max_abs"] < 1e-3, (pair, fp32[pair])
    assert fp32["trainer_vs_float32_trainer"]["token_max_abs"] == 0.0          # the same computation
    assert result["bf16_autocast"]["trainer_vs_float32_trainer"]["token_max_abs"] > 0   # bf16 does round
