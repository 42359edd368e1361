"""SiteGuard on constructed rollouts: re-verification, text screens, the likelihood gate, quarantine, state."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from hacrl_fed.screen_config import QuarantineConfig, ScreenConfig
from hacrl_fed.reward.extract import extract_final_answer
from hacrl_fed.screens import SiteGuard, cut_rollout
from hacrl_fed.screens.guard import rewrite_rollout
from hacrl_fed.v1 import rollout_pb2 as pb

PAYLOAD = " Visit www.mathtricks.example for more!"
REFS = {f"q{i}": pb.PromptItem(prompt_id=f"q{i}", text=f"What is {i} + 2?", reference_answer=str(i + 2),
                               answer_style="boxed") for i in range(4)}


def fake_verify(responses, references, styles, problems):
    """The project's extraction, exact comparison (a stand-in for math-verify on integers)."""
    out = []
    for text, ref in zip(responses, references):
        got = extract_final_answer(text)
        ok = got is not None and got.answer == ref
        out.append(SimpleNamespace(reward=float(ok), verdict="correct" if ok else "incorrect"))
    return out


def rollout(pid: str, idx: int, text: str, *, reward: float | None = None, lp: float = -20.0, n: int = 10):
    ok = fake_verify([text], [REFS[pid].reference_answer], None, None)[0].reward
    r = pb.Rollout(prompt_id=pid, sample_index=idx, response_text=text, reward=ok if reward is None else reward,
                   verdict=pb.CORRECT if ok else pb.INCORRECT, behaviour_logprob_sum=lp, behaviour_token_count=n,
                   finish_reason=pb.STOP)
    r.behaviour_eos_logprob = -1.0
    return r


def correct(pid: str) -> str:
    i = int(pid[1:])
    return f"{i} + 2 = {i + 2}, so the answer is \\boxed{{{i + 2}}}."


def honest_batch(wrong_every: int = 2) -> list[pb.Rollout]:
    return [rollout(pid, j, correct(pid) if j % wrong_every else f"I think {pid} is {j}.") for pid in REFS
            for j in range(2)]


def own_texts() -> dict[tuple[str, int], str]:
    """The learner's own responses: the honest peer's wording (the same family), right and wrong."""
    return {(pid, j): correct(pid) if j else f"I think {pid} is {j}." for pid in REFS for j in range(2)}


def guard(**cfg) -> SiteGuard:
    return SiteGuard("me", ScreenConfig(**cfg), fake_verify)


def test_site_verdict_replaces_a_flipped_coordinator_reward():
    g = guard()
    rows = honest_batch()
    rewards = {("peer", r.prompt_id, r.sample_index): r.reward for r in rows}
    flipped = [("peer", "q0", 0), ("peer", "q1", 1)]        # the coordinator lies about two rows
    for key in flipped:
        rewards[key] = 1.0 - rewards[key]
    g.begin_step(1, own_texts())
    g.reverify({"peer": rows}, REFS, rewards)
    assert all(rewards[("peer", r.prompt_id, r.sample_index)] == r.reward for r in rows)   # the truth
    metrics, refused = g.finish_step(["peer"])
    assert metrics["src/peer/coordinator_disagreements"] == 2 and metrics["coordinator_reward_disagreements"] == 2
    assert metrics["src/peer/claim_disagreements"] == 0       # the peer itself was honest: not flagged
    assert metrics["src/peer/flagged"] == 0 and metrics["src/peer/standing"] == 0 and not refused


def test_a_lying_source_is_flagged_and_down_weighted():
    g = guard()
    rows = honest_batch()
    rows[0].reward = 1.0 - rows[0].reward                      # the source claims a wrong row is right
    rewards = {("peer", r.prompt_id, r.sample_index): r.reward for r in rows}
    g.begin_step(1, own_texts())
    g.reverify({"peer": rows}, REFS, rewards)
    assert rewards[("peer", rows[0].prompt_id, 0)] == 0.0
    metrics, _ = g.finish_step(["peer"])
    assert metrics["src/peer/claim_disagreements"] == 1 and metrics["src/peer/flagged"] == 1
    assert g.standing["peer"].status == "downweighted" and metrics["src/peer/screen_weight"] == 0.5


def test_reverify_off_keeps_the_coordinator_reward():
    g = guard(reverify=False)
    rows = honest_batch()
    rewards = {("peer", r.prompt_id, r.sample_index): 1.0 for r in rows}
    g.begin_step(1, own_texts())
    g.reverify({"peer": rows}, REFS, rewards)
    assert set(rewards.values()) == {1.0}


def test_payload_tail_is_cut_and_honest_rows_pass():
    g = guard()
    honest = honest_batch()
    poisoned = [rollout(r.prompt_id, r.sample_index, r.response_text + (PAYLOAD if r.reward else ""), lp=-30.0,
                        n=14) for r in honest_batch()]
    g.begin_step(1, own_texts())
    out = g.screen_text({"honest": honest, "mallory": poisoned}, own_texts())
    assert [r.response_text for r in out["honest"]] == [r.response_text for r in honest]
    cut = [r for r in out["mallory"] if r.reward]
    assert [r.response_text for r in cut] == [correct(r.prompt_id) for r in cut]   # cut after "}."
    metrics, _ = g.finish_step(["honest", "mallory"])
    assert metrics["src/honest/screened_rows"] == 0
    assert metrics["src/mallory/screened_tail_cut"] == len(cut) == 4 and metrics["src/mallory/flagged"] == 1


def test_cut_keeps_the_per_byte_behaviour_and_ends_with_stop():
    text = "So \\boxed{4}." + PAYLOAD
    r = rollout("q2", 0, text, lp=-41.0, n=21)
    r.finish_reason = pb.LENGTH
    r.ClearField("behaviour_eos_logprob")
    c = cut_rollout(r, len("So \\boxed{4}."))
    assert c.response_text == "So \\boxed{4}." and c.finish_reason == pb.STOP and c.behaviour_eos_logprob == 0.0
    frac = len(c.response_text) / len(text)
    assert c.behaviour_logprob_sum == pytest.approx(-41.0 * frac)
    assert c.behaviour_token_count == round(21 * frac) + 1


def test_reject_policy_and_long_answers():
    g = guard(tail={"policy": "reject", "budget_bytes": 16, "min_length_bytes": 64, "max_length_factor": 4.0})
    long_correct = ("Let me think about this very carefully step by step. " * 8) + correct("q1")
    rows = [rollout("q0", 0, correct("q0") + PAYLOAD), rollout("q1", 0, long_correct), rollout("q2", 0, correct("q2"))]
    g.begin_step(1, own_texts())
    out = g.screen_text({"mallory": rows}, own_texts())
    assert [r.prompt_id for r in out["mallory"]] == ["q2"]
    metrics, _ = g.finish_step(["mallory"])
    assert metrics["src/mallory/screened_tail_reject"] == 1 and metrics["src/mallory/screened_length"] == 1


FILLER = "We add the two numbers together and check the sum once more."


def _own_reasoned(pid: str) -> str:
    """The learner's own answer: one sentence of reasoning (≈ 100 bytes)."""
    i = int(pid[1:])
    return f"{i} + 2 = {i + 2}. {FILLER} So the answer is \\boxed{{{i + 2}}}."


def _verbose(pid: str, fillers: int = 4) -> str:
    """An honest, more verbose peer: the same reasoning at ≈ 3× the learner's length (its sentences are the
    learner's own, so the recurring-phrase screen leaves them alone)."""
    i = int(pid[1:])
    return f"{i} + 2 = {i + 2}. " + f"{FILLER} " * fillers + f"So the answer is \\boxed{{{i + 2}}}."


@pytest.mark.parametrize("bare_sources", [1, 2])
def test_bare_answers_cannot_get_a_longer_honest_peer_length_rejected(bare_sources):
    """Issue 25 D2: a member (or two) answering every prompt with a bare ``\\boxed{N}`` must not move the length
    reference so that an honest peer with ≈ 3× the learner's length is length-rejected, down-weighted at step 1
    and quarantined at step 3. The reference is the learner's own responses, which no peer can move."""
    own = {(pid, j): _own_reasoned(pid) for pid in REFS for j in range(2)}
    honest = [rollout(pid, j, _verbose(pid)) for pid in REFS for j in range(2)]
    ratio = len(_verbose("q0").encode()) / len(_own_reasoned("q0").encode())
    assert 2.5 < ratio < 3.5 and len(_verbose("q0").encode()) > ScreenConfig().tail.min_length_bytes
    bare = {f"bare{k}": [rollout(pid, j, f"\\boxed{{{int(pid[1:]) + 2}}}") for pid in REFS for j in range(2)]
            for k in range(bare_sources)}
    g = guard()
    for step in (1, 2, 3):
        g.begin_step(step, own)
        out = g.screen_text({"honest": honest, **bare}, own)
        assert [r.response_text for r in out["honest"]] == [r.response_text for r in honest]
        metrics, refused = g.finish_step(["honest", *bare])
        assert metrics["src/honest/screened_length"] == 0 and metrics["src/honest/screened_rows"] == 0
        assert metrics["src/honest/flagged"] == 0 and metrics["src/honest/standing"] == 0 and not refused
        assert g.weight("honest") == 1.0


def test_two_padding_sources_cannot_shield_each_other():
    """The other way round: two sources that both pad every answer (≈ 10× the learner) are both length-rejected;
    each one's padding must not raise the reference the other is judged by."""
    own = {(pid, j): _own_reasoned(pid) for pid in REFS for j in range(2)}
    padded = {src: [rollout(pid, j, _verbose(pid, fillers=16)) for pid in REFS for j in range(2)]
              for src in ("pad1", "pad2")}
    g = guard()
    g.begin_step(1, own)
    out = g.screen_text(padded, own)
    assert out == {"pad1": [], "pad2": []}
    metrics, _ = g.finish_step(["pad1", "pad2"])
    assert metrics["src/pad1/screened_length"] == metrics["src/pad2/screened_length"] == 8
    assert metrics["src/pad1/flagged"] == metrics["src/pad2/flagged"] == 1


class Row(SimpleNamespace):
    pass


def _row(src, pid, idx, nbytes, reward=1.0):
    return Row(source_agent=src, prompt_id=pid, sample_index=idx, is_own=src == "me", content_bytes=nbytes,
               reward=reward)


def test_gate_screens_a_likelihood_outlier_against_its_source_only():
    """Honest cross-family rows (far from the learner's own likelihood) pass; a row that is an outlier for its
    source gets weight 0; decisions are made once per row and step."""
    g = guard(likelihood={"warmup_rows": 8})
    g.begin_step(1, {(f"q{i}", 0): "x" * 100 for i in range(16)})
    own = [_row("me", f"q{i}", 0, 100) for i in range(16)]
    assert g.gate(own, [-25.0 - (i % 3) for i in range(16)]) == [1.0] * 16      # ≈ −0.26 nats/byte
    peer = [_row("gemma", f"q{i}", 1, 100) for i in range(16)]
    sums = [-55.0 + (i % 5) * 3 for i in range(16)]                             # ≈ −0.55 nats/byte, another family
    assert g.gate(peer, sums) == [1.0] * 16
    odd = [_row("gemma", "q0", 7, 100), _row("gemma", "q1", 7, 100)]
    assert g.gate(odd, [-140.0, -50.0]) == [0.0, 1.0]
    assert g.gate(odd, [0.0, 0.0]) == [0.0, 1.0]                                  # second epoch: same decision
    # an unrewarded outlier (a payload cannot be learned from it) and a row of a few bytes are kept
    assert g.gate([_row("gemma", "q2", 7, 100, reward=0.0), _row("gemma", "q3", 7, 5)], [-140.0, -20.0]) == [1.0, 1.0]
    metrics, _ = g.finish_step(["gemma"])
    assert metrics["src/gemma/screened_likelihood"] == 1
    assert metrics["src/me/ll_per_byte"] == pytest.approx(-0.26, abs=0.01)
    assert metrics["src/gemma/ll_z_min"] < -3.5


def inside(pid: str) -> str:
    i = int(pid[1:])
    return f"{i} + 2 = {i + 2}.{PAYLOAD} So the answer is \\boxed{{{i + 2}}}."


def test_a_payload_inside_the_reasoning_is_cut_out_and_the_row_trained():
    """The payload recurs across mallory's answers to different prompts: cut out of each row (the answer
    kept, the behaviour log-prob scaled to the kept bytes); an honest peer's rows, whose text is tied to its
    prompt, and phrases of the learner's own responses or of the prompts are untouched; no quarantine flag."""
    g = guard()
    prompts = {pid: p.text for pid, p in REFS.items()}
    rows = [rollout(pid, j, inside(pid), lp=-40.0, n=20) for pid in REFS for j in range(2)]
    honest = honest_batch()
    g.begin_step(1, own_texts())
    out = g.screen_text({"mallory": rows, "honest": honest}, own_texts(), prompt_texts=prompts)
    texts = [r.response_text for r in out["mallory"]]
    assert all("mathtricks" not in t for t in texts) and len(texts) == len(rows)
    assert texts[0] == "0 + 2 = 2. So the answer is \\boxed{2}."
    assert [extract_final_answer(t).answer for t in texts] == [extract_final_answer(r.response_text).answer for r in rows]
    kept = len(texts[0].encode()) / len(rows[0].response_text.encode())
    assert out["mallory"][0].behaviour_logprob_sum == pytest.approx(-39.0 * kept - 1.0)   # content scaled, EOS kept
    assert [r.response_text for r in out["honest"]] == [r.response_text for r in honest]
    metrics, _ = g.finish_step(["mallory", "honest"])
    assert metrics["src/mallory/screened_key_cut"] == 8 and metrics["src/mallory/keys_cut"] == 6
    assert metrics["src/honest/screened_key_cut"] == 0 == metrics["src/honest/screened_phrase_cut"]
    assert metrics["src/mallory/flagged"] == 0 and g.standing["mallory"].status == "trusted"
    # the phrase screen alone (the key screen off) cuts it as a recurring phrase
    alone = guard(key={"enabled": False})
    alone.begin_step(1, own_texts())
    assert [r.response_text for r in alone.screen_text({"mallory": rows}, own_texts(),
                                                        prompt_texts=prompts)["mallory"]] == texts
    assert alone.finish_step(["mallory"])[0]["src/mallory/screened_phrase_cut"] == 8
    # a phrase of the prompts is licensed
    g.begin_step(3, own_texts())
    quoted = {pid: f"{t} {PAYLOAD}" for pid, t in prompts.items()}
    assert g.screen_text({"mallory": rows}, own_texts(), prompt_texts=quoted)["mallory"] == rows
    off = guard(phrase={"enabled": False}, key={"enabled": False})
    off.begin_step(1, own_texts())
    assert off.screen_text({"mallory": rows}, own_texts(), prompt_texts=prompts)["mallory"] == rows


def test_the_answer_is_never_cut_and_a_row_a_cut_would_change_is_left_out(monkeypatch):
    """"The answer is \\boxed{N}" recurs across prompts (the learner phrases it otherwise): the phrase is cut up
    to the answer, which stays; were the answer not protected, the cut would change it: the row is left out."""
    rows = [rollout(pid, 0, f"{pid[1:]} and 2 make {int(pid[1:]) + 2}. The answer is \\boxed{{{int(pid[1:]) + 2}}}.")
            for pid in REFS]
    mine = {("q0", 0): "I get 2."}
    g = guard(key={"enabled": False})   # the phrase screen alone (the key screen cuts these words as keys)
    g.begin_step(1, mine)
    out = g.screen_text({"peer": rows}, mine)["peer"]
    assert [r.response_text for r in out][:2] == ["0 and 2 make 2. \\boxed{2}.", "1 and 2 make 3. \\boxed{3}."]
    monkeypatch.setattr("hacrl_fed.screens.guard._answer_span", lambda text, style: None)
    g.begin_step(2, mine)
    assert g.screen_text({"peer": rows}, mine).get("peer") == []
    metrics, _ = g.finish_step(["peer"])
    assert metrics["src/peer/screened_phrase_cut"] == 4 and metrics["src/peer/screened_out"] == 4


def test_rewrite_rollout_scales_the_behaviour_terms_to_the_kept_bytes():
    r = rollout("q0", 0, "  abcdefghij", lp=-21.0, n=11)            # 10 bytes of content, EOS −1
    half = rewrite_rollout(r, "abcde")
    assert half.response_text == "  abcde" and half.finish_reason == pb.STOP
    assert half.behaviour_logprob_sum == pytest.approx(-10.0 - 1.0) and half.behaviour_token_count == 6
    truncated = pb.Rollout()
    truncated.CopyFrom(r)
    truncated.finish_reason = pb.LENGTH
    truncated.ClearField("behaviour_eos_logprob")
    cut = rewrite_rollout(truncated, "abcde")
    assert cut.finish_reason == pb.LENGTH and not cut.HasField("behaviour_eos_logprob")
    assert cut.behaviour_logprob_sum == pytest.approx(-10.5) and cut.behaviour_token_count == 6
    assert cut_rollout(truncated, 5).finish_reason == pb.STOP


def test_quarantine_lifecycle_state_roundtrip_and_operator_release():
    g = guard(quarantine=QuarantineConfig(quarantine_after=2, release_after_clean=2).model_dump())
    poisoned = [rollout(p, 0, correct(p) + PAYLOAD) for p in REFS]
    for step in (1, 2):
        g.begin_step(step, own_texts())
        g.screen_text({"mallory": poisoned}, own_texts())
        g.finish_step(["mallory"])
    assert g.standing["mallory"].status == "quarantined"
    g.begin_step(3, own_texts())
    out = g.screen_text({"mallory": poisoned, "honest": honest_batch()}, own_texts())
    assert "mallory" not in out and "honest" in out
    metrics, refused = g.finish_step(["mallory", "honest"])
    assert metrics["src/mallory/quarantined_rows"] == 4 and metrics["quarantined_sources"] == 1
    assert refused and refused[0].startswith("mallory: quarantined by this site since step 2")

    restored = guard(quarantine=QuarantineConfig(quarantine_after=2, release_after_clean=2).model_dump())
    restored.load_state_dict(json.loads(json.dumps(g.state_dict())))
    assert restored.standing == g.standing and restored.totals == g.totals
    assert list(restored.own_window) == list(g.own_window)
    assert restored.release(["mallory", "nobody"]) == ["mallory"]
    assert restored.standing["mallory"].status == "trusted"

    clean = [rollout(p, 0, correct(p)) for p in REFS]           # a clean window lifts it automatically
    for step in (4, 5):
        g.begin_step(step, own_texts())
        g.screen_text({"mallory": clean}, own_texts())
        g.finish_step(["mallory"])
    assert g.standing["mallory"].status == "trusted"
    with pytest.raises(ValueError, match="version"):
        restored.load_state_dict({"version": 99})


def test_screens_off_pass_everything():
    g = SiteGuard("me", ScreenConfig.off(), fake_verify)
    rows = [rollout("q0", 0, correct("q0") + PAYLOAD * 3)]
    assert not g.active
    assert g.screen_text({"m": rows}, own_texts())["m"] == rows


def test_a_row_two_screens_act_on_counts_once():
    """A payload tail cut, then the likelihood gate on the cut row: one screened row (and one rewarded row
    screened for the quarantine's flag), left out; a row only cut is screened but still trained."""
    g = guard(likelihood={"warmup_rows": 8})
    g.begin_step(1, {(f"q{i % 4}", i): "x" * 100 for i in range(16)})
    poisoned = [rollout("q0", 0, correct("q0") + PAYLOAD), rollout("q1", 0, correct("q1") + PAYLOAD)]
    out = g.screen_text({"mallory": poisoned}, own_texts())["mallory"]
    assert len(out) == 2                                                        # both cut, both still rows
    g.gate([_row("me", f"q{i % 4}", i, 100) for i in range(16)], [-25.0 - (i % 3) for i in range(16)])
    rows = [_row("mallory", r.prompt_id, r.sample_index, 100) for r in out]
    assert g.gate(rows, [-300.0, -26.0]) == [0.0, 1.0]                          # the first is also an outlier
    metrics, _ = g.finish_step(["mallory"])
    assert metrics["src/mallory/screened_tail_cut"] == 2 and metrics["src/mallory/screened_likelihood"] == 1
    assert metrics["src/mallory/screened_rows"] == 2 and metrics["src/mallory/screened_out"] == 1
    assert metrics["src/mallory/rewarded_screened"] == 2 == metrics["src/mallory/rewarded_rows"]


def test_episodes_skip_the_text_screens_but_are_counted_and_a_quarantined_sources_rows_left_out():
    from hacrl_fed.screens.rules import SourceStanding

    g = guard()
    episode = [pb.Rollout(prompt_id=f"g{i}", sample_index=0, reward=float(i == 0)) for i in range(3)]
    g.standing["mallory"] = SourceStanding(status="quarantined", since_step=1, reason="3 flagged steps")
    g.begin_step(2, {})
    out = g.pass_episodes({"peer": episode, "mallory": episode})
    assert out == {"peer": episode}
    metrics, refused = g.finish_step(["peer", "mallory"])
    assert metrics["src/peer/screen_rows"] == 3 and metrics["src/peer/rewarded_rows"] == 1
    assert metrics["src/mallory/quarantined_rows"] == 3 and metrics["src/peer/screened_rows"] == 0
    assert refused == ["mallory: quarantined by this site since step 1 (3 flagged steps); its 3 rows are not trained"]
