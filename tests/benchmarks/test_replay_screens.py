"""Smoke test of ``benchmarks/replay_screens.py`` on a small synthetic gen-cache (the frozen batches
``attack_poison.py`` caches): two prompts of the seeded sampler, correct answers from mallory and the honest peer.
The replay poisons mallory's rows with each variant, runs the default screens, and reports per variant; the tail
payload is cut from every poisoned row and no honest row is left out."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import replay_screens

ROOT = Path(__file__).resolve().parents[2]
PROMPTS, G = 2, 2


def _cache(cache: Path, honest_right: bool = True) -> None:
    """``mallory-s0-t1.json`` and ``gemma3-s0-t1.json``: G correct rollouts per prompt of step 1 (the honest peer's
    wrong ones with ``honest_right=False``)."""
    from hacrl_fed.config import SimulateConfig, load_config
    from hacrl_fed.data.datasets import load_problems
    from hacrl_fed.data.sampler import PromptSampler
    from hacrl_fed.v1 import rollout_pb2 as pb

    cfg = load_config(ROOT / "examples" / "default.toml", SimulateConfig)
    cfg.run.data.eval_size = 32
    problems = PromptSampler(load_problems(cfg.run.data)[0], PROMPTS, seed=0).next_batch()
    cache.mkdir()
    for name in ("mallory", "gemma3"):
        batch = pb.RolloutBatch(run_id="replay", step=1, agent_id=name)
        right = honest_right or name == "mallory"
        for p in problems:
            for j in range(G):
                answer = p.answer if right else f"{p.answer}0"
                text = f"We work it out step by step. So the answer is \\boxed{{{answer}}}."
                batch.rollouts.add(prompt_id=p.id, sample_index=j, response_text=text, reward=float(right),
                                   verdict=pb.CORRECT if right else pb.INCORRECT, behaviour_logprob_sum=-4.0,
                                   behaviour_token_count=16, finish_reason=pb.STOP)
        payload = base64.b64encode(batch.SerializeToString()).decode()
        (cache / f"{name}-s0-t1.json").write_text(json.dumps({"batch": payload, "generate_s": 0.0}))


def test_replay_on_a_synthetic_cache(tmp_path, capsys):
    _cache(tmp_path / "gen-cache")
    out = tmp_path / "replay.md"
    argv = ["--cache", str(tmp_path / "gen-cache"), "--steps", "1", "--prompts", str(PROMPTS),
            "--variants", "tail,drip", "--out", str(out)]
    assert replay_screens.main(argv) == 0
    text = out.read_text()
    assert text == capsys.readouterr().out.rstrip("\n") + "\n"
    rows = {line.split(" | ")[0].lstrip("| "): line.strip("| ").split(" | ") for line in text.splitlines()
            if line.startswith(("| tail ", "| drip "))}
    # variant | poisoned | key left | mallory left out | honest rows | honest left out | key cut | phrase cut | tail cut
    assert rows["tail"][1] == str(PROMPTS * G) and rows["drip"][1] == str(G)     # drip: the first prompt only
    assert rows["tail"][2] == "0"                                                # the tail screen cut every payload
    for v in ("tail", "drip"):
        assert rows[v][4] == str(PROMPTS * G) and rows[v][5].startswith("0 ")   # every honest row seen, none out


def test_the_distillation_columns(tmp_path):
    """The honest peer wrong, mallory right: every kept mallory row is above its group's baseline (own rows 1,
    honest 0, mallory 1 → mean 2/3), so the distillation term would take them all — with no key left after the
    tail screen."""
    _cache(tmp_path / "gen-cache", honest_right=False)
    out = tmp_path / "replay.md"
    argv = ["--cache", str(tmp_path / "gen-cache"), "--steps", "1", "--prompts", str(PROMPTS),
            "--variants", "tail", "--out", str(out)]
    assert replay_screens.main(argv) == 0
    row = next(line.strip("| ").split(" | ") for line in out.read_text().splitlines() if line.startswith("| tail "))
    kept = PROMPTS * G - int(row[3])
    assert kept > 0 and row[9] == str(kept) and row[10] == "0"


def test_distilled_rows_are_those_above_their_group_mean():
    from types import SimpleNamespace as R

    rows = [R(prompt_id="a", reward=1.0), R(prompt_id="b", reward=1.0), R(prompt_id="b", reward=0.0)]
    group = rows + [R(prompt_id="a", reward=1.0), R(prompt_id="b", reward=0.0)]
    # a: mean 1 → a right row is not above it; b: mean 1/3 → the right row is, the wrong one is not
    assert replay_screens.distilled_rows(rows, group) == [rows[1]]
