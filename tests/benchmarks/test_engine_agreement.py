"""Smoke test of ``benchmarks/engine_agreement.py`` on the tiny task pair: ``hf`` and ``loop`` decode greedily to
the same tokens, so every outcome agrees and the paired difference is 0 with a zero-width interval; a
``before.json`` of another engine is refused."""

from __future__ import annotations

import json


def test_hf_and_loop_agree_item_by_item(tmp_path, bench):
    out = tmp_path / "agree"
    bench("engine_agreement.py", "--pair", "tiny-tasks", "--eval-size", "3", "--engines", "hf", "loop",
          "--threads", "1", "--out", str(out), timeout=900)
    r = json.loads((out / "results.json").read_text())
    assert r["engines"] == ["hf", "loop"] and all(s > 0 for s in r["eval_s"].values())
    assert set(r["comparison"]) == {"llama-bpe", "gemma-unigram"}
    for sets in r["comparison"].values():
        assert set(sets) == {"held_out", "families"}
        for c in sets.values():
            assert c["items"] > 0 and c["same_outcome"] == 1.0 and c["diff"] == 0.0
            assert c["right_a_only"] == c["right_b_only"] == 0 and c["acc_a"] == c["acc_b"]
    assert r["outcomes"]["hf"] == r["outcomes"]["loop"]
    assert "| llama-bpe | held_out |" in (out / "results.md").read_text()


def test_a_before_json_of_another_engine_is_refused(tmp_path, bench):
    (tmp_path / "before.json").write_text(json.dumps({"agents": {}}))
    (tmp_path / "meta.json").write_text(json.dumps({"engines": {"a": "loop"}}))
    proc = bench("engine_agreement.py", "--pair", "tiny-tasks", "--engines", "hf", "loop", "--before",
                 str(tmp_path / "before.json"), "--out", str(tmp_path / "o"), check=False)
    assert proc.returncode == 2 and "made with engine(s) ['loop'], not 'hf'" in proc.stderr
