"""One content check of a rollout batch, run by both sides: the coordinator (when it collects the
step's batches) and every learner site (when it opens the pool it trains on) refuse the same bad
batches, and for the same reason."""

from __future__ import annotations

import pytest
import torch

from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.update.optim_config import OptimConfig
from hacrl_fed.protocol.validation import BatchRejected, Reason, validate_envelope
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.worker.trainer import StepRollouts, Trainer
from hostile import HOSTILE, envelope_bytes, honest_batch

MAX_BYTES = 64 * 1024
CONTENT = {Reason.UNKNOWN_PROMPT, Reason.BAD_SAMPLE_INDEX, Reason.DUPLICATE_SAMPLE, Reason.MISSING_SAMPLE,
           Reason.BAD_REWARD, Reason.BAD_LOGPROB, Reason.BAD_TOKEN_COUNT, Reason.BAD_VERDICT,
           Reason.BAD_FINISH_REASON, Reason.BAD_VERSION}
"""Reasons of :func:`~hacrl_fed.protocol.validation.check_rollouts` (the rest are envelope checks)."""
ENVELOPES = sorted(case for case in HOSTILE if case != "garbage")
"""Every hostile delivery that is a SignedEnvelope at all (a site only ever receives envelopes)."""


def learner_rejects(federation, plan: pb.RoundPlan, raw: bytes) -> list[str]:
    """What a learner site ("carol") says about one peer envelope of ``plan``'s step (empty: accepted)."""
    trainer = Trainer("carol", torch.nn.Linear(1, 1), None, algo=AlgoConfig(), optim=OptimConfig(),
                      max_response_tokens=8, roster=federation.roster, max_batch_bytes=MAX_BYTES)
    own = StepRollouts(run_id=plan.run_id, step=plan.step, prompt_ids={p.prompt_id: (1,) for p in plan.prompts},
                       samples={}, payload=b"", temperature=1.0, samples_per_prompt=plan.samples_per_prompt,
                       max_new_tokens=plan.sampling.max_new_tokens)
    batches, rejected = trainer._open_batches([pb.SignedEnvelope.FromString(raw)], own)
    assert (not rejected) == (len(batches) == 2)
    return rejected


def test_an_honest_batch_passes_both_sides(federation, plan):
    p = plan(step=2)
    raw = envelope_bytes(honest_batch(p, "mallory"), federation.keys["mallory"].own)
    validate_envelope(raw, federation.roster, p, expected_agent="mallory", max_bytes=MAX_BYTES)
    assert learner_rejects(federation, p, raw) == []


@pytest.mark.parametrize("case", ENVELOPES)
def test_both_sides_reject_the_same_bad_batches(federation, plan, case):
    build, reason = HOSTILE[case]
    p = plan(step=4)
    raw = build(p, "mallory", federation.keys["mallory"], MAX_BYTES)
    with pytest.raises(BatchRejected) as info:
        validate_envelope(raw, federation.roster, p, expected_agent="mallory", max_bytes=MAX_BYTES)
    assert info.value.reason is reason
    rejected = learner_rejects(federation, p, raw)
    assert len(rejected) == 1, rejected
    if reason in CONTENT:
        assert f": {reason.value}: " in rejected[0], rejected[0]

