"""The content check of an episode's rollouts (docs/multi-turn.md, "A trajectory on the wire"): the coordinator and
every learner refuse a trajectory that does not fit its plan's environment instance or bounds, with the reason
``bad_trajectory``, and a one-shot prompt's rollout may not carry turns."""

from __future__ import annotations

import time

import pytest

import torch

from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.update.optim_config import OptimConfig
from hacrl_fed.protocol.validation import BatchRejected, Reason, validate_envelope
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.worker.trainer import StepRollouts, Trainer
from hostile import envelope_bytes, honest_batch

MAX_BYTES = 64 * 1024


def learner_rejects(federation, plan: pb.RoundPlan, raw: bytes) -> list[str]:
    """What a learner site ("carol") says about one peer envelope of ``plan``'s step (empty: accepted)."""
    trainer = Trainer("carol", torch.nn.Linear(1, 1), None, algo=AlgoConfig(), optim=OptimConfig(),
                      max_response_tokens=8, roster=federation.roster, max_batch_bytes=MAX_BYTES)
    own = StepRollouts(run_id=plan.run_id, step=plan.step, prompt_ids={p.prompt_id: (1,) for p in plan.prompts},
                       samples={}, payload=b"", temperature=1.0, samples_per_prompt=plan.samples_per_prompt,
                       max_new_tokens=plan.sampling.max_new_tokens, prompts={p.prompt_id: p for p in plan.prompts})
    batches, rejected = trainer._open_batches([pb.SignedEnvelope.FromString(raw)], own)
    assert (not rejected) == (len(batches) == 2)
    return rejected


def episode_plan(step: int = 3, *, b: int = 2, g: int = 2, max_turns: int = 3) -> pb.RoundPlan:
    prompts = [pb.PromptItem(prompt_id=f"guess-{i}", answer_style="episode",
                             episode=pb.EpisodeSpec(env_id="textarena/GuessTheNumber-v0", config_json="{}", seed=i,
                                                    max_turns=max_turns)) for i in range(b)]
    return pb.RoundPlan(run_id="run-test", step=step, samples_per_prompt=g, prompts=prompts,
                        sampling=pb.SamplingParams(temperature=1.0, max_new_tokens=16), deadline_unix_s=time.time() + 60)


def episode_batch(plan: pb.RoundPlan, agent: str) -> pb.RolloutBatch:
    """Honest trajectories: observation, guess, hint, guess (stopped, with its EOS log-prob), final observation."""
    batch = pb.RolloutBatch(run_id=plan.run_id, step=plan.step, agent_id=agent, model_fingerprint=f"fake:{agent}",
                            sampling=plan.sampling)
    for p in plan.prompts:
        for i in range(plan.samples_per_prompt):
            r = batch.rollouts.add(prompt_id=p.prompt_id, sample_index=i, reward=1.0, verdict=pb.CORRECT,
                                   behaviour_logprob_sum=-6.0, behaviour_token_count=8, finish_reason=pb.STOP)
            r.episode.CopyFrom(p.episode)
            r.turns.add(role=pb.ENV, text="Guess a number between 1 and 20.")
            r.turns.add(role=pb.AGENT, text="[10]", finish_reason=pb.STOP, behaviour_eos_logprob=-0.5)
            r.turns.add(role=pb.ENV, text="The target number is higher.")
            r.turns.add(role=pb.AGENT, text="[15]", finish_reason=pb.STOP, behaviour_eos_logprob=-0.25)
            r.turns.add(role=pb.ENV, text="Congratulations! You guessed the correct number.")
    return batch


def _seed(b):
    b.rollouts[0].episode.seed += 1


def _order(b):
    b.rollouts[0].turns[1].role = pb.ENV


def _too_many(b):
    for _ in range(4):
        b.rollouts[0].turns.add(role=pb.AGENT, text="[1]", finish_reason=pb.STOP)
        b.rollouts[0].turns.add(role=pb.ENV, text="lower")


def _long_observation(b):
    b.rollouts[0].turns[2].text = "x" * 5000


def _long_message(b):
    b.rollouts[0].turns[1].text = "y" * (128 * 16 + 1)


def _eos_on_cut_turn(b):
    b.rollouts[0].turns[3].finish_reason = pb.LENGTH
    b.rollouts[0].finish_reason = pb.LENGTH


def _sum_above_eos_terms(b):
    b.rollouts[0].behaviour_logprob_sum = -0.1


def _response_text(b):
    b.rollouts[0].response_text = r"\boxed{15}"


def _finish_not_last_turns(b):
    b.rollouts[0].finish_reason = pb.LENGTH


def _too_many_tokens(b):
    b.rollouts[0].behaviour_token_count = 3 * 16 + 1


FORGED = {"another seed": _seed, "roles out of order": _order, "more turns than max_turns": _too_many,
          "observation too long": _long_observation, "message too long": _long_message,
          "EOS term on a cut turn": _eos_on_cut_turn, "sum above its EOS terms": _sum_above_eos_terms,
          "response text besides turns": _response_text, "finish reason not the last turn's": _finish_not_last_turns,
          "more tokens than turns allow": _too_many_tokens}


def test_an_honest_trajectory_passes_both_sides(federation):
    plan = episode_plan()
    raw = envelope_bytes(episode_batch(plan, "mallory"), federation.keys["mallory"].own)
    validate_envelope(raw, federation.roster, plan, expected_agent="mallory", max_bytes=MAX_BYTES)
    assert learner_rejects(federation, plan, raw) == []


@pytest.mark.parametrize("case", sorted(FORGED))
def test_both_sides_refuse_a_bad_trajectory(federation, case):
    plan = episode_plan()
    batch = episode_batch(plan, "mallory")
    FORGED[case](batch)
    raw = envelope_bytes(batch, federation.keys["mallory"].own)
    with pytest.raises(BatchRejected) as info:
        validate_envelope(raw, federation.roster, plan, expected_agent="mallory", max_bytes=MAX_BYTES)
    assert info.value.reason is Reason.BAD_TRAJECTORY and "guess-0#0" in str(info.value)
    rejected = learner_rejects(federation, plan, raw)
    assert len(rejected) == 1 and ": bad_trajectory: " in rejected[0], rejected


def test_a_one_shot_prompt_refuses_turns(federation, plan):
    p = plan(step=2)
    batch = honest_batch(p, "mallory")
    batch.rollouts[1].turns.add(role=pb.ENV, text="hello")
    raw = envelope_bytes(batch, federation.keys["mallory"].own)
    with pytest.raises(BatchRejected) as info:
        validate_envelope(raw, federation.roster, p, expected_agent="mallory", max_bytes=MAX_BYTES)
    assert info.value.reason is Reason.BAD_TRAJECTORY
