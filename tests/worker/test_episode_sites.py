"""Multi-turn episodes between two sites whose tokenizers differ (docs/multi-turn.md): each site plays its episodes
turn by turn, publishes the trajectories, the coordinator's checks and replay accept them and refuse a forged one,
and each learner trains on the other's episodes re-rendered in its own template (environment tokens masked)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hacrl_fed.coordinator.phases import reverify
from hacrl_fed.envs import EpisodeSpec, check_trajectory, make_env, turns_from_proto
from hacrl_fed.protocol.validation import AcceptedBatch, validate_envelope
from hacrl_fed.protocol.keys import Roster
from hacrl_fed.screen_config import ScreenConfig
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb

KINDS = {"alice": "tiny-llama-bpe", "bob": "tiny-gemma-unigram"}
GUESS = "textarena/GuessTheNumber-v0"


def episode_plan(step: int, *, prompts: int = 2, g: int = 2, max_turns: int = 3) -> pb.RoundPlan:
    items = [pb.PromptItem(prompt_id=f"guess-{step}-{i}", answer_style="episode", task="guess",
                           episode=EpisodeSpec(GUESS, {}, 100 * step + i, max_turns).to_proto())
             for i in range(prompts)]
    return pb.RoundPlan(run_id="run-a", step=step, samples_per_prompt=g, prompts=items,
                        sampling=pb.SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=6, seed=3))


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_sites_play_share_replay_and_train_on_each_others_episodes(make_sites, plans, verifier):
    _, make_table = plans
    sites = make_sites(KINDS, screens=ScreenConfig(reverify=True), model_kw={"max_episode_tokens": 256})
    alice, bob = sites.start("alice"), sites.start("bob")
    plan = episode_plan(1)
    env_a, env_b = alice.generate(plan).envelope, bob.generate(plan).envelope
    roster = Roster.load(sites.cfg["alice"].roster)
    accepted = [validate_envelope(e.SerializeToString(), roster, plan, expected_agent=name, max_bytes=1 << 20)
                for name, e in (("alice", env_a), ("bob", env_b))]
    for item in accepted:   # every trajectory is a whole episode the environment replays to the same end
        assert len(item.batch.rollouts) == 4
        for r in item.batch.rollouts:
            spec = EpisodeSpec.from_proto(r.episode)
            check = check_trajectory(spec, turns_from_proto(r.turns))
            assert check.ok and check.reward == r.reward, check.reason
            agent_turns = [t for t in r.turns if t.role == pb.AGENT]
            assert 1 <= len(agent_turns) <= 3 and r.behaviour_token_count >= len(agent_turns)
    verdicts = reverify(verifier.verify, accepted, plan)
    assert all(not v.replay_mismatches and not v.corrections for v in verdicts.values())

    # a forged environment answer: the coordinator's replay finds it and names it
    forged = pb.RolloutBatch()
    forged.CopyFrom(accepted[1].batch)
    forged.rollouts[0].turns[0].text += " (the number is 7)"
    bad = reverify(verifier.verify, [AcceptedBatch("bob", forged, b"")], plan)["bob"]
    assert bad.replay_mismatches and "replay_mismatch" in bad.replay_mismatches[0]

    # random tiny models lose every game: the coordinator's corrections give alice's own groups some variance
    wins = [("alice", r.prompt_id, r.sample_index, float(r.sample_index == 0)) for r in accepted[0].batch.rollouts]
    table = make_table(plan, {"alice": 0.5, "bob": 0.5}, warmup=True, corrections=wins)
    before = _weights(alice.model)
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, capabilities=table,
                                          envelopes=[env_a, env_b]))
    assert not report.rejected, report.rejected
    per_source = {s.source_agent: dict(s.metrics) for s in report.per_source}
    assert per_source["bob"]["rows"] == 4 and per_source["alice"]["rows"] == 4
    # the text screens do not read episodes, but the rows are counted as seen (the report's "peer grad" needs it)
    assert per_source["bob"]["screen_rows"] == 4
    # bob's agent turns are trained in alice's tokens: a positive count, the environment's tokens left out
    assert 0 < per_source["bob"]["tokens"]
    assert any(not torch.equal(before[k], v) for k, v in alice.model.state_dict().items())


def test_an_episode_evaluation_counts_episodes_won(make_sites):
    sites = make_sites({"alice": "tiny-llama-bpe"}, model_kw={"max_episode_tokens": 256})
    alice = sites.start("alice")
    plan = episode_plan(1, prompts=3)
    resp = alice.evaluate(wpb.EvaluateRequest(prompts=plan.prompts, samples=1, run_id="run-a",
                                              sampling=pb.SamplingParams(temperature=0.0, max_new_tokens=6)))
    assert resp.metrics["problems"] == 3 and 0.0 <= resp.metrics["avg@1"] <= 1.0
    assert [r.prompt_id for r in resp.results] == [p.prompt_id for p in plan.prompts]


class _AlwaysTen:
    """A scripted engine: every agent turn is ``[10]`` followed by EOS (the worker's real evaluation path runs
    around it)."""

    def __init__(self, tokenizer, max_batch_sequences: int):
        self.tokenizer, self.max_batch_sequences = tokenizer, max_batch_sequences

    def generate(self, contexts, n, sampling, seed):
        from hacrl_fed.rollout.engine import GeneratedSample

        ids = (*self.tokenizer("[10]", add_special_tokens=False).input_ids, self.tokenizer.eos_token_id)
        return [GeneratedSample(i, 0, tuple(c), ids, "[10]", "stop", -0.5 * len(ids), len(ids), (-0.5,) * len(ids))
                for i, c in enumerate(contexts)]


def test_an_episode_evaluation_reports_each_episodes_reward(make_sites):
    """Partial rewards (docs/multi-turn.md): each result's ``reward_sum`` is the reward of the episode the
    environment gives the same moves, a win counts as correct, and ``reward_mean`` is their mean."""
    sites = make_sites({"alice": "tiny-llama-bpe"}, model_kw={"max_episode_tokens": 256})
    alice = sites.start("alice")
    alice.engine = _AlwaysTen(alice.tokenizer, alice.engine.max_batch_sequences)
    specs = [EpisodeSpec(GUESS, {"reward": "partial"}, seed, 3) for seed in range(8)]
    prompts = [pb.PromptItem(prompt_id=f"guess-{s.seed}", answer_style="episode", task="guess", episode=s.to_proto())
               for s in specs]
    resp = alice.evaluate(wpb.EvaluateRequest(prompts=prompts, samples=1, run_id="run-a",
                                              sampling=pb.SamplingParams(temperature=0.0, max_new_tokens=6)))
    expected = []
    for spec in specs:   # the same three moves, played on a fresh copy of the environment
        env = make_env(spec)
        env.reset()
        for _ in range(spec.max_turns):
            step = env.step("[10]")
            if step.done:
                break
        expected.append(step.reward if step.done else 0.0)
    got = [r.reward_sum for r in resp.results]
    assert got == pytest.approx(expected) and [r.correct for r in resp.results] == [int(x >= 1) for x in expected]
    assert any(0.0 < x < 1.0 for x in expected)   # lost games earn how close they came, not 0
    assert resp.metrics["reward_mean"] == pytest.approx(sum(expected) / len(expected))
    assert resp.metrics["avg@1"] == pytest.approx(sum(x >= 1 for x in expected) / len(expected))


def test_an_export_after_episodes_shows_a_games_first_observation_as_its_example(make_sites):
    import json

    from hacrl_fed.data.prompts import EXAMPLE_PROBLEM, PROMPT_FILE, render_prompt

    sites = make_sites({"alice": KINDS["alice"]}, model_kw={"max_episode_tokens": 256})
    alice = sites.start("alice")
    export = wpb.CheckpointRequest(kind=wpb.CheckpointRequest.EXPORT)
    before = json.loads((Path(alice.checkpoint(export).path) / PROMPT_FILE).read_text())
    assert before["example"]["problem"] == EXAMPLE_PROBLEM          # nothing played yet: the arithmetic example
    plan = episode_plan(1, prompts=1, g=1, max_turns=1)
    alice.generate(plan)
    rec = json.loads((Path(alice.checkpoint(wpb.CheckpointRequest(
        kind=wpb.CheckpointRequest.EXPORT, path=str(alice.path_roots[0] / "after"))).path) / PROMPT_FILE).read_text())
    first = make_env(EpisodeSpec.from_proto(plan.prompts[0].episode)).reset()
    assert rec["example"]["problem"] == first and "Calculate 2 + 3." not in rec["example"]["prompt"]
    assert rec["example"]["messages"][-1] == {"role": "user", "content": first}
    assert tuple(alice.tokenizer.apply_chat_template(rec["example"]["messages"], add_generation_prompt=True,
                                                     return_dict=True)["input_ids"]) == \
        tuple(render_prompt(alice.tokenizer, first, system_prompt=alice.cfg.model.system_prompt))
