"""The behaviour log-prob is optional on the wire: its presence (proto3 ``optional``, ``HasField``) is the flag.

Rows without one (a source behind an API without log-probs) pass the content check with a token count of 0
(unknown) .. ``max_new_tokens``; rows that claim one must carry a finite sum ≤ 0 over ≥ 1 token. Hostile
variants of the flag are in ``tests/helpers/hostile.py`` (``nan_logprob_claimed``, ``eos_term_without_a_sum``,
``no_sum_token_count_over_the_plan``), rejected alike by the coordinator and the learners
(tests/protocol/test_batch_checks.py).
"""

from __future__ import annotations

import pytest

from hacrl_fed.protocol.validation import (BatchRejected, Reason, check_rollouts, has_behaviour_logprob,
                                           validate_envelope)
from hacrl_fed.v1 import rollout_pb2 as pb
from hostile import envelope_bytes, honest_batch

MAX_BYTES = 64 * 1024


def _check(batch, p):
    check_rollouts(batch, [q.prompt_id for q in p.prompts], p.samples_per_prompt,
                   max_new_tokens=p.sampling.max_new_tokens)


def test_presence_survives_serialization_even_for_a_zero_sum():
    r = pb.Rollout(prompt_id="p", behaviour_logprob_sum=0.0, behaviour_token_count=1)
    assert has_behaviour_logprob(pb.Rollout.FromString(r.SerializeToString()))
    r.ClearField("behaviour_logprob_sum")
    back = pb.Rollout.FromString(r.SerializeToString())
    assert not has_behaviour_logprob(back) and back.behaviour_logprob_sum == 0.0


@pytest.mark.parametrize("count", [0, 5])
def test_a_batch_without_log_probs_is_accepted(federation, plan, count):
    p = plan(step=2)
    batch = honest_batch(p, "alice")
    for r in batch.rollouts:
        r.ClearField("behaviour_logprob_sum")
        r.behaviour_token_count = count
    raw = envelope_bytes(batch, federation.keys["alice"].own)
    item = validate_envelope(raw, federation.roster, p, expected_agent="alice", max_bytes=MAX_BYTES)
    assert not any(has_behaviour_logprob(r) for r in item.batch.rollouts)


def test_mixed_rows_are_accepted_and_a_claimed_sum_still_needs_tokens(plan):
    p = plan()
    batch = honest_batch(p, "alice")
    batch.rollouts[0].ClearField("behaviour_logprob_sum")
    batch.rollouts[0].behaviour_token_count = 0
    _check(batch, p)
    batch.rollouts[1].behaviour_token_count = 0          # claims a sum over no token
    with pytest.raises(BatchRejected) as info:
        _check(batch, p)
    assert info.value.reason is Reason.BAD_TOKEN_COUNT


def test_the_rejection_detail_shows_an_absent_sum_as_none(plan):
    p = plan()
    batch = honest_batch(p, "alice")
    batch.rollouts[0].ClearField("behaviour_logprob_sum")
    batch.rollouts[0].reward = 7.0
    with pytest.raises(BatchRejected, match="logprob_sum=None") as info:
        _check(batch, p)
    assert info.value.reason is Reason.BAD_REWARD


def test_a_screen_cut_keeps_a_row_without_log_prob_without_one():
    from hacrl_fed.screens.guard import cut_rollout

    r = pb.Rollout(prompt_id="p", response_text=" abcdefgh", behaviour_token_count=8, finish_reason=pb.LENGTH)
    out = cut_rollout(r, 4)
    assert out.response_text == " abcd" and out.finish_reason == pb.STOP
    assert not has_behaviour_logprob(out) and not out.HasField("behaviour_eos_logprob")
    assert out.behaviour_token_count == 4
