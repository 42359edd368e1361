"""Pure coordinator pieces: round plan, re-verification, capability table."""

from __future__ import annotations

import pytest

from fedutil import FakeVerdict, boxed_verify, problems
from hacrl_fed.algo.capability import CapabilityTracker
from hacrl_fed.config import SamplingConfig
from hacrl_fed.coordinator.phases import build_round_plan, capability_table, reverify, step_seed
from hacrl_fed.protocol.validation import AcceptedBatch
from hacrl_fed.reward.verdict import Verdict
from hacrl_fed.v1 import rollout_pb2 as pb
from hostile import honest_batch


def test_plan_carries_prompts_references_sampling_and_a_per_step_seed():
    sampling = SamplingConfig(temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=33)
    plan = build_round_plan(run_id="r", step=4, problems=problems(3), samples_per_prompt=5, sampling=sampling,
                            seed=11, deadline_unix_s=123.5)
    assert [p.prompt_id for p in plan.prompts] == ["p0", "p1", "p2"]
    assert plan.prompts[2].reference_answer == "5" and plan.prompts[2].answer_style == "boxed"
    assert (plan.samples_per_prompt, plan.deadline_unix_s, plan.run_id, plan.step) == (5, 123.5, "r", 4)
    assert plan.sampling.temperature == pytest.approx(0.7) and plan.sampling.top_k == 5
    assert plan.sampling.seed == step_seed(11, 4) != step_seed(11, 5)
    assert plan.sampling.seed < 2**63
    with pytest.raises(ValueError, match="duplicate"):
        build_round_plan(run_id="r", step=1, problems=problems(2) * 2, samples_per_prompt=1, sampling=sampling,
                         seed=0, deadline_unix_s=0)
    with pytest.raises(ValueError, match="at least one"):
        build_round_plan(run_id="r", step=1, problems=[], samples_per_prompt=1, sampling=sampling, seed=0,
                         deadline_unix_s=0)


def _accepted(plan, agent, mutate=None) -> AcceptedBatch:
    batch = honest_batch(plan, agent)
    if mutate:
        mutate(batch)
    return AcceptedBatch(agent=agent, batch=batch, envelope=b"")


def test_reverify_uses_one_verifier_call_and_its_verdict_wins(plan):
    p = plan(b=2, g=2)
    calls = []

    def verify(responses, references, styles, problems_):
        calls.append(len(responses))
        return boxed_verify(responses, references, styles)

    def liar(batch):
        for r in batch.rollouts:
            r.reward, r.verdict = 1.0, pb.CORRECT

    out = reverify(verify, [_accepted(p, "alice"), _accepted(p, "bob", liar)], p)
    assert calls == [8]
    assert out["alice"].accuracy == 0.5 and out["alice"].disagreements == 0
    assert out["bob"].site_accuracy == 1.0 and out["bob"].accuracy == 0.5
    assert [(c.prompt_id, c.sample_index, c.reward, c.verdict) for c in out["bob"].corrections] == [
        ("p0", 1, 0.0, pb.INCORRECT), ("p1", 1, 0.0, pb.INCORRECT)]


def test_truncated_responses_get_zero_without_verification(plan):
    p = plan(b=1, g=2)

    def truncate(batch):
        batch.rollouts[0].finish_reason = pb.LENGTH  # a correct answer, but cut at max_new_tokens

    seen = []

    def verify(responses, *rest):
        seen.extend(responses)
        return boxed_verify(responses, *rest)

    out = reverify(verify, [_accepted(p, "alice", truncate)], p, truncated_reward="zero")
    assert len(seen) == 1 and out["alice"].rewards == [0.0, 0.0]
    assert out["alice"].disagreements == 1  # the site had rewarded the truncated sample
    verified = reverify(boxed_verify, [_accepted(p, "alice", truncate)], p, truncated_reward="verify")
    assert verified["alice"].rewards == [1.0, 0.0]


def test_reverify_counts_verifier_errors_and_verdict_only_mismatches(plan):
    p = plan(b=1, g=2)

    def errors(responses, *rest):
        return [FakeVerdict("verifier_error", 0.0) for _ in responses]

    out = reverify(errors, [_accepted(p, "alice")], p)
    assert out["alice"].verifier_errors == 2
    assert out["alice"].disagreements == 1  # the correct sample lost its reward
    assert out["alice"].verdict_mismatches == 1  # incorrect vs verifier_error, both 0
    assert out["alice"].verifier_timeouts == 0
    with pytest.raises(ValueError, match="verdicts"):
        reverify(lambda *a: [], [_accepted(p, "alice")], p)


def test_reverify_counts_the_verifier_timeouts_of_each_agent(plan):
    """A verdict the verifier gave up on (CPU limit, after its retry) is counted per agent for the step record."""
    p = plan(b=1, g=2)

    def first_times_out(responses, *rest):
        return [Verdict.error("timeout after 5.0 s CPU")] + [Verdict.error("worker crashed (exit code 9)")] * (
            len(responses) - 1)

    out = reverify(first_times_out, [_accepted(p, "alice"), _accepted(p, "bob")], p)
    assert (out["alice"].verifier_timeouts, out["alice"].verifier_errors) == (1, 2)
    assert (out["bob"].verifier_timeouts, out["bob"].verifier_errors) == (0, 2)


def test_capability_table_lists_this_steps_agents(plan):
    tracker = CapabilityTracker(window=2, warmup_steps=1)
    p = plan(step=1)
    tracker.update({"alice": 0.5, "bob": 0.0})
    table = capability_table(tracker, p, {"alice": 0.5, "bob": 0.0}, [])
    assert table.warmup  # first update is inside the warm-up
    assert {a.agent_id: (a.capability, list(a.window), a.step_accuracy) for a in table.agents} == {
        "alice": (0.5, [0.5], 0.5), "bob": (1e-8, [0.0], 0.0)}
    tracker.update({"alice": 1.0})
    table = capability_table(tracker, plan(step=2), {"alice": 1.0}, [])
    assert not table.warmup and [a.agent_id for a in table.agents] == ["alice"]
    assert table.agents[0].capability == 0.75 and table.step == 2


def test_plan_carries_each_prompts_task_and_reverify_measures_accuracy_per_task():
    from hacrl_fed.data.problem import Problem

    probs = [Problem(id=f"sums-{i}", problem=f"{i} + 1 =", answer=str(i + 1), source="sums") for i in range(2)]
    probs += [Problem(id="words-0", problem="spell", answer="x", source="words"),
              Problem(id="f-1", problem="q", answer="1", source="a source with spaces")]
    p = build_round_plan(run_id="r", step=1, problems=probs, samples_per_prompt=2, sampling=SamplingConfig(),
                         seed=0, deadline_unix_s=0)
    assert [x.task for x in p.prompts] == ["sums", "sums", "words", ""]   # not a plain label: no task

    out = reverify(boxed_verify, [_accepted(p, "alice")], p)              # sample 0 right, sample 1 wrong
    assert out["alice"].task_accuracy == {"sums": 0.5, "words": 0.5}
    tracker = CapabilityTracker(window=2)
    tracker.update({"alice": out["alice"].accuracy}, {"alice": out["alice"].task_accuracy})
    table = capability_table(tracker, p, {"alice": out["alice"].accuracy}, [])
    assert dict(table.agents[0].task_capability) == {"sums": 0.5, "words": 0.5}
    assert table.agents[0].capability == 0.5
