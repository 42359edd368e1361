"""Checkpoints of a site sharded over 2 CPU processes: 1 → 2 → 1 processes resume exactly, a rank killed mid-save
leaves the previous checkpoint in place and the site resumes from it, the export loads with transformers alone."""

from __future__ import annotations

import pytest
import torch
from conftest import run_ranks

PARAM_ATOL = 1e-6


def _steps(mode: str, tiny_dirs, ckpt, out, steps: int = 1) -> dict:
    run_ranks("site_steps.py", [mode, tiny_dirs["tiny-llama-bpe"], tiny_dirs["tiny-gemma-unigram"], str(ckpt),
                                str(out), str(steps)], 1)
    return torch.load(out)


def _close(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=PARAM_ATOL, rtol=0, msg=lambda m: f"{name}: {m}")


def test_one_to_two_to_one_process_resume_equals_three_plain_steps(tmp_path, tiny_dirs):
    straight = _steps("plain", tiny_dirs, tmp_path / "straight", tmp_path / "straight.pt", steps=3)
    first = _steps("plain", tiny_dirs, tmp_path / "ckpt", tmp_path / "1.pt")
    second = _steps("sharded", tiny_dirs, tmp_path / "ckpt", tmp_path / "2.pt")
    third = _steps("plain", tiny_dirs, tmp_path / "ckpt", tmp_path / "3.pt")
    assert (first["resumed_from"], second["resumed_from"], third["resumed_from"]) == (0, 1, 2)
    assert '"sharded": 2' in (tmp_path / "ckpt" / "step-00000002" / "state.json").read_text()
    _close(straight["params"], third["params"])        # AdamW moments and step count survived both crossings
    assert second["rank_codes_after_close"] == [0]     # rank 1 stopped cleanly, none left running
    from transformers import AutoModelForCausalLM

    export = AutoModelForCausalLM.from_pretrained(tmp_path / "2.export", dtype=torch.float32)
    _close(second["params"], export.state_dict())


def test_rank_killed_mid_save_keeps_the_previous_checkpoint_and_the_site_resumes_it(tmp_path, tiny_dirs):
    out = _steps("kill-save", tiny_dirs, tmp_path / "ckpt", tmp_path / "k.pt")
    assert "rank 1" in out["failure"] and "SIGKILL" in out["failure"], out["failure"]
    assert out["rank_codes"] == [-9]                   # no rank left running after the failure
    assert out["listing"] == [".lock", "latest", "step-00000001"] or out["listing"] == ["latest", "step-00000001"]
    assert out["resumed_after_failure"] == 1
    _close(out["saved_weights"], out["restored"])      # the weights of the last complete checkpoint
    assert out["step"] == 2 and out["rank_codes_after_close"] == [0]


@pytest.mark.parametrize("n", [2])
def test_sharded_checkpoint_lists_every_rank_shard(tmp_path, tiny_dirs, n):
    _steps("sharded", tiny_dirs, tmp_path / "ckpt", tmp_path / "s.pt")
    names = sorted(p.name for p in (tmp_path / "ckpt" / "step-00000001").iterdir())
    assert names == [".metadata", *[f"__{r}_0.distcp" for r in range(n)], "rng.pt", "state.json"]
