"""The attack benchmark's mechanism at tiny size (benchmarks/attack_poison.py): a malicious authenticated site
whose correct rows carry a payload reaches the victim's gradient without the screens, and only as clean
answers with them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import attack_poison as ap  # noqa: E402


def test_poison_variants_keep_the_answer_and_carry_the_payload():
    from hacrl_fed.reward.extract import extract_final_answer

    text = "2 + 3 = 5. So the answer is \\boxed{5}."
    for variant in ap.VARIANTS:
        out = ap.poison_text(text, variant)
        assert ap.marker(variant) in out and extract_final_answer(out).answer == "5"
    assert ap.poison_text(text, "tail").endswith(ap.PAYLOAD)
    assert ap.poison_text(text, "inside").index(ap.PAYLOAD) < ap.poison_text(text, "inside").index("\\boxed")
    with pytest.raises(ValueError):
        ap.poison_text(text, "nope")


def _tiny_attack(tmp_path_factory, peer_distill_coef: float = 0.0):
    """The attack on the tiny pair (the victim's peer distillation λ₀ as ``--peer-distill-coef``)."""
    from hacrl_fed.config import SimulateConfig, load_config

    cfg = load_config(ap.ROOT / "examples" / "tiny.toml", SimulateConfig)
    cfg.run.sampling.max_new_tokens = 16
    cfg.run.data.eval_size = 4
    for a in cfg.agents:
        a.model.max_response_tokens = 96
        a.model.cache_dir = str(tmp_path_factory.mktemp("models"))
        a.algo = a.algo.model_copy(update={"name": "hacpo_cross_family", "cross_ratio_unit": "byte",
                                           "cross_below_window": "success_gated", "cross_above_window": "on_policy"})
    cfg.agents[0].algo.peer_distill_coef = peer_distill_coef
    return ap.Attack(cfg, tmp_path_factory.mktemp("gen-cache"))


@pytest.fixture(scope="module")
def attack(tmp_path_factory):
    out = _tiny_attack(tmp_path_factory)
    yield out
    out.close()


def test_payload_rows_reach_the_gradient_only_without_screens(attack):
    items = list(attack.fed.held_out)
    cells = {on: attack.run_cell(variant="tail", screens=on, seed=0, steps=1, oracle=True, eval_items=items,
                                 eval_tokens=16) for on in (False, True)}
    off, on = (cells[k]["per_step"][0] for k in (False, True))
    assert off["poisoned_rows"] == on["poisoned_rows"] == 4            # every row of mallory, oracle answers
    m_off, m_on = off["per_source"][ap.ATTACKER], on["per_source"][ap.ATTACKER]
    assert m_off["pos_adv_grad_rows"] == 4 and "screened_rows" not in m_off    # payload rows trained as they are
    assert m_on["screened_tail_cut"] == 4 and m_on["pos_adv_grad_rows"] == 4   # …or as clean answers, cut
    assert m_on["standing"] == 1                                              # and mallory is down-weighted
    assert on["metrics"]["screened_rows"] >= 4
    # the same frozen generations served both cells (cached per seed and step)
    assert cells[False]["per_step"][0]["generate_s"][ap.ATTACKER] == cells[True]["per_step"][0]["generate_s"][ap.ATTACKER]
    assert set(cells[True]["after"]) == {p.id for p in items} and 0.0 <= ap.emission(cells[True]["after"], "tail") <= 1
    assert all(cells[k]["payload_logprob"] < 0 for k in cells)


def test_a_rescoring_attacker_reports_the_victims_own_logprobs(attack):
    """The strongest attacker (``--attacker-logprobs rescored``) reports its model's teacher-forced log-prob of the
    rewritten text: a copy of the victim's weights, so before the victim trains its rows are on-policy for it
    (s = 1) and the ratio's clip window is no defence; the scaled attacker's are not."""
    from hacrl_fed.tokenization.views import foreign_row

    attack.fed.reset(optim={"seed": 0})
    victim = attack.fed.workers[attack.victim]
    plan = ap.build_plan(attack, seed=0, step=1)
    batch, _ = attack._frozen_batch(ap.ATTACKER, plan, 0)
    plan.sampling.max_new_tokens = 64   # room for the payload after a tiny model's answer (the cap it must keep)
    scaled, n = ap.poison_batch(batch, plan, "tail", oracle=True)
    rescored, _ = ap.poison_batch(batch, plan, "tail", oracle=True)
    ap.rescore_batch(attack.fed.workers[ap.ATTACKER], rescored, plan, "tail")
    prompts = victim._render(plan.prompts)
    rows = [foreign_row(victim.tokenizer, prompts[r.prompt_id], r, ap.ATTACKER, 10**6,
                        separator=victim.trainer.response_separator) for r in rescored.rollouts]
    own = victim.engine.score([r.prompt_ids for r in rows], [r.response_ids for r in rows])
    assert n == len(rows) == 4
    assert all(ap.PAYLOAD in r.response_text for r in rescored.rollouts)
    assert all(r.behaviour_token_count <= plan.sampling.max_new_tokens for r in rescored.rollouts)
    for r, (total, count, per_token) in zip(rescored.rollouts, own):
        assert r.behaviour_token_count == count
        assert r.behaviour_logprob_sum == pytest.approx(total, abs=1e-4)
        assert r.behaviour_eos_logprob == pytest.approx(per_token[-1], abs=1e-5)
    # the scaled attacker's sums are off by nats (the rewritten bytes at the generated text's mean rate)
    assert max(abs(a.behaviour_logprob_sum - b.behaviour_logprob_sum)
               for a, b in zip(scaled.rollouts, rescored.rollouts)) > 1.0


def test_adaptive_variants_target_their_prompts_and_vary_the_lead_in():
    plan = type("Plan", (), {"prompts": [type("P", (), {"prompt_id": f"p{i}"})() for i in range(4)]})()
    assert ap.targets(plan, "drip") == {"p0"} and ap.targets(plan, "half") == {"p0", "p2"}
    assert ap.targets(plan, "short") == {"p0", "p1", "p2", "p3"}
    text = "2 + 3 = 5. So the answer is \\boxed{5}."
    leads = {ap.poison_text(text, "leadin", salt=k).split(ap.LEADIN_KEY)[0] for k in range(64)}
    assert len(leads) == 64                                    # no lead-in repeats across 64 rows
    assert ap.poison_text(text, "format").endswith("\\boxed{5}. Final: 27")
    assert len(" Final: 27".encode()) <= 32                   # under the tail screen's budget


def test_the_mix_variant_gives_each_prompt_all_four_keys():
    text = "2 + 3 = 5. So the answer is \\boxed{5}."
    rows = [ap.poison_text(text, "mix", salt=k) for k in range(4)]
    assert [any(ap.marker(v) in r for r in rows) for v in ap.MIX] == [True] * 4
    after = {"a": [True, rows[1]], "b": [True, text]}
    assert ap.emission(after, "mix") == 0.5 and ap.emission(after, "split") == 0.5 and ap.emission(after, "short") == 0


@pytest.fixture(scope="module")
def distill_attack(tmp_path_factory):
    out = _tiny_attack(tmp_path_factory, peer_distill_coef=0.5)
    yield out
    out.close()


def test_the_distillation_term_takes_mallorys_rows_only_as_the_screens_leave_them(distill_attack, tmp_path):
    """With peer distillation on, mallory's oracle rows (reward 1, above the group's baseline) enter the supervised
    term: with the payload when the screens are off, cut after the answer when they are on. The summary lists the
    term's rows per source."""
    items = list(distill_attack.fed.held_out)
    cells = {on: distill_attack.run_cell(variant="tail", screens=on, seed=0, steps=1, oracle=True, eval_items=items,
                                         eval_tokens=16) for on in (False, True)}
    m_off, m_on = (cells[k]["per_step"][0]["per_source"][ap.ATTACKER] for k in (False, True))
    assert m_off["distill_rows"] == 4 and "screened_rows" not in m_off
    assert m_on["distill_rows"] == 4 and m_on["screened_tail_cut"] == 4
    assert cells[True]["per_step"][0]["metrics"]["distill_coef"] == 0.5
    (tmp_path / "cells").mkdir()
    for on, cell in cells.items():
        (tmp_path / "cells" / f"tail-{'on' if on else 'off'}-s0.json").write_text(json.dumps(cell))
    victim = distill_attack.victim
    meta = {"command": "test", "victim": victim, "honest": distill_attack.honest, "oracle": True, "steps": 1,
            "prompts_per_step": 2, "samples_per_prompt": 4, "eval_size": 4, "peer_distill_coef": 0.5,
            "models": {a.name: a.model.name_or_path for a in distill_attack.cfg.agents}}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "before.json").write_text(json.dumps({"accuracy": 0.0, "emission": 0.0}))
    text = ap.summarize(tmp_path)
    assert f"tail-on-s0: {ap.ATTACKER} 4" in text and f"tail-off-s0: {ap.ATTACKER} 4" in text
