"""Counts and lengths are bounded by the plan: behaviour tokens ≤ max_new_tokens, text ≤ max_response_chars,
on the coordinator and on every learner site, with the boundary itself accepted."""

from __future__ import annotations

import pytest
import torch

from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.update.optim_config import OptimConfig
from hacrl_fed.protocol.envelope import DEFAULT_MAX_BATCH_BYTES
from hacrl_fed.protocol.validation import BatchRejected, Reason, validate_envelope
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.worker.trainer import StepRollouts, Trainer
from hostile import envelope_bytes, honest_batch


def _both_sides(federation, plan: pb.RoundPlan, batch: pb.RolloutBatch) -> tuple[Reason | None, list[str]]:
    raw = envelope_bytes(batch, federation.keys["mallory"].own)
    try:
        validate_envelope(raw, federation.roster, plan, expected_agent="mallory", max_bytes=DEFAULT_MAX_BATCH_BYTES)
        coordinator = None
    except BatchRejected as rej:
        coordinator = rej.reason
    trainer = Trainer("carol", torch.nn.Linear(1, 1), None, algo=AlgoConfig(), optim=OptimConfig(),
                      max_response_tokens=8, roster=federation.roster)
    own = StepRollouts(run_id=plan.run_id, step=plan.step, prompt_ids={p.prompt_id: (1,) for p in plan.prompts},
                       samples={}, payload=b"", temperature=1.0, samples_per_prompt=plan.samples_per_prompt,
                       max_new_tokens=plan.sampling.max_new_tokens)
    _, rejected = trainer._open_batches([pb.SignedEnvelope.FromString(raw)], own)
    return coordinator, rejected


def max_response_chars(max_new_tokens: int) -> int:
    from hacrl_fed.protocol.validation import max_response_chars as bound

    return bound(max_new_tokens)


def _long_text(b: pb.RolloutBatch) -> None:
    b.rollouts[-1].response_text = "9" * (max_response_chars(b.sampling.max_new_tokens) + 1)


def _set(field: str, value):
    return lambda b: setattr(b.rollouts[-1], field, value)


BOUNDED = {
    "empty_batch": (lambda b: b.ClearField("rollouts"), "missing_sample"),
    "wrapped_token_count": (_set("behaviour_token_count", 2**32 - 1), "bad_token_count"),
    "tokens_above_max_new_tokens": (lambda b: _set("behaviour_token_count", b.sampling.max_new_tokens + 1)(b),
                                    "bad_token_count"),
    "text_longer_than_the_plan_allows": (_long_text, "text_too_long"),
    "huge_fingerprint": (lambda b: setattr(b, "model_fingerprint", "f" * 5000), "bad_fingerprint"),
    "control_chars_in_fingerprint": (lambda b: setattr(b, "model_fingerprint", "sha256:\x1b[2J"), "bad_fingerprint"),
}
"""case → (mutation of an honest batch, the reason both sides give)."""


@pytest.mark.parametrize("case", sorted(BOUNDED))
def test_both_sides_refuse_out_of_bound_batches(federation, plan, case):
    mutate, reason = BOUNDED[case]
    p = plan()
    batch = honest_batch(p, "mallory")
    mutate(batch)
    coordinator, rejected = _both_sides(federation, p, batch)
    assert coordinator is not None and coordinator.value == reason
    assert len(rejected) == 1 and f": {reason}: " in rejected[0], rejected


def test_a_negative_count_wrapped_on_the_wire_is_refused(federation, plan):
    p = plan()
    batch = honest_batch(p, "mallory")
    wire = pb.Rollout()
    wire.MergeFromString(b"\x38" + bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F]))   # field 7, varint 2^32 - 1
    assert wire.behaviour_token_count == 4_294_967_295          # what −1 becomes in a uint32
    batch.rollouts[0].behaviour_token_count = wire.behaviour_token_count
    reason, rejected = _both_sides(federation, p, batch)
    assert reason is Reason.BAD_TOKEN_COUNT and len(rejected) == 1 and "bad_token_count" in rejected[0]


@pytest.mark.parametrize("extra, ok", [(0, True), (1, False)])
def test_token_count_bound_is_the_plans_max_new_tokens(federation, plan, extra, ok):
    p = plan()
    batch = honest_batch(p, "mallory")
    batch.rollouts[1].behaviour_token_count = p.sampling.max_new_tokens + extra
    reason, rejected = _both_sides(federation, p, batch)
    assert (reason is None and rejected == []) if ok else (reason is Reason.BAD_TOKEN_COUNT and rejected)


def test_a_100000_character_response_is_refused_under_the_default_size_cap(federation, plan):
    p = plan()                                  # max_new_tokens 16
    batch = honest_batch(p, "mallory")
    batch.rollouts[0].response_text = "1" * 100_000
    assert len(batch.SerializeToString()) < DEFAULT_MAX_BATCH_BYTES     # the size cap alone lets it through
    reason, rejected = _both_sides(federation, p, batch)
    assert reason is not None and reason.value == "text_too_long" and "text_too_long" in rejected[0]


@pytest.mark.parametrize("extra, ok", [(0, True), (1, False)])
def test_text_bound_follows_max_new_tokens(federation, plan, extra, ok):
    p = plan()
    batch = honest_batch(p, "mallory")
    batch.rollouts[0].response_text = "é" * (128 * p.sampling.max_new_tokens + extra)  # MAX_CHARS_PER_TOKEN
    reason, rejected = _both_sides(federation, p, batch)
    assert (reason is None and rejected == []) if ok else (reason is not None and reason.value == "text_too_long")


def test_bounds_scale_with_the_plan(federation, plan):
    p = plan()
    p.sampling.max_new_tokens = 4096
    batch = honest_batch(p, "mallory")
    batch.rollouts[0].response_text = "1" * 100_000
    batch.rollouts[0].behaviour_token_count = 4000
    assert _both_sides(federation, p, batch) == (None, [])


def test_worker_refuses_plans_beyond_its_limits():
    from hacrl_fed.worker.agent import MAX_NEW_TOKENS, MAX_PROMPT_CHARS, _check_prompts, sampling_from_proto
    from hacrl_fed.worker.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="max_new_tokens"):
        sampling_from_proto(pb.SamplingParams(temperature=1, max_new_tokens=MAX_NEW_TOKENS + 1), 16)
    with pytest.raises(InvalidRequestError, match="characters"):
        _check_prompts([pb.PromptItem(prompt_id="p", text="x" * (MAX_PROMPT_CHARS + 1))])
    with pytest.raises(InvalidRequestError, match="prompt ids"):
        _check_prompts([pb.PromptItem(prompt_id="p" * 1000, text="What is 1 + 1?")])
