"""Asynchronous train orders (docs/async.md): peer batches that answer other steps' plans (``TrainRequest.peer_plans``).

The learner alice trains step 2 on its own rollouts of plan 2 and bob's batches of plan 2 and of plan 1 (a
peer plan): bob's plan-1 rows form prompt groups without own rows, which take the ``plain_mean`` baseline.
Bad peer batches cost only themselves; a malformed peer plan refuses the order with the weights unchanged.
"""

from __future__ import annotations

import statistics

import pytest
import torch

from hacrl_fed.algo.advantages import ADV_EPS, group_advantages_reference, row_advantages
from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.protocol.envelope import sign_batch
from hacrl_fed.protocol.keys import load_signing_key
from hacrl_fed.screen_config import ScreenConfig
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb
from hacrl_fed.worker import trainer as trainer_module
from hacrl_fed.worker.errors import InvalidRequestError

KINDS = {"alice": "tiny-llama-bpe", "bob": "tiny-gemma-unigram", "carol": "tiny-llama-bpe"}
"""alice and bob run workers; carol only signs (its batches are re-issued copies of bob's)."""


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _per_source(report) -> dict[str, dict[str, float]]:
    return {s.source_agent: dict(s.metrics) for s in report.per_source}


def _batch(env: pb.SignedEnvelope) -> pb.RolloutBatch:
    return pb.RolloutBatch.FromString(env.payload)


def _as(sites, agent: str, batch: pb.RolloutBatch) -> pb.SignedEnvelope:
    """``batch`` re-issued by roster agent ``agent``, signed with its key."""
    out = pb.RolloutBatch()
    out.CopyFrom(batch)
    out.agent_id = agent
    return sign_batch(out, load_signing_key(sites.cfg[agent].private_key))


@pytest.fixture
def capture(monkeypatch):
    """Every ``row_advantages`` call of the trainer: (rows, ratios, no_own_baseline, advantages)."""
    calls = []

    def spy(rows, ratios, cfg, *, learner, no_own_baseline="raise"):
        adv = row_advantages(rows, ratios, cfg, learner=learner, no_own_baseline=no_own_baseline)
        calls.append((list(rows), dict(ratios), no_own_baseline, adv))
        return adv

    monkeypatch.setattr(trainer_module, "row_advantages", spy)
    return calls


def test_a_peer_batch_of_another_plan_is_trained_with_the_plain_mean_baseline(make_sites, plans, capture):
    make_plan, make_table = plans
    sites = make_sites(KINDS, screens=ScreenConfig(reverify=False))   # train on the coordinator's rewards
    alice, bob = sites.start("alice"), sites.start("bob")
    p1, p2 = make_plan(1), make_plan(2)
    env_b1 = bob.generate(p1).envelope            # bob's batch of the earlier plan, pooled late
    env_a2, env_b2 = alice.generate(p2).envelope, bob.generate(p2).envelope
    # bob weaker than alice: ω = 1 / r_{bob→alice} = 2.5; bob's sample 0 of every plan-1 prompt rewarded 1,
    # sample 1 rewarded 0 ⇒ μ̂ = 2.5 · (1 + 0) / 2 = 1.25 > 1 in groups without own rows
    corrections = ([("bob", r.prompt_id, r.sample_index, float(r.sample_index == 0)) for r in _batch(env_b1).rollouts]
                   + [("alice", r.prompt_id, r.sample_index, float(r.sample_index == 0))
                      for r in _batch(env_a2).rollouts])
    table = make_table(p2, {"alice": 0.5, "bob": 0.2}, corrections=corrections)
    before = _weights(alice.model)
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=2, plan=p2, capabilities=table,
                                          envelopes=[env_a2, env_b1, env_b2], peer_plans=[p1]))

    assert not report.rejected
    src = _per_source(report)
    assert src["alice"]["rows"] == 6 and src["bob"]["rows"] == 12      # plan 2's 3 × 2 plus plan 1's 3 × 2
    assert src["bob"]["capability_ratio"] == pytest.approx(0.4)
    assert report.metrics["async/peer_plans"] == 1
    assert report.metrics["async/peer_plan_rows"] == 6
    assert report.metrics["async/no_own_groups"] == 3                   # plan 1's prompts q1-0 … q1-2
    after = _weights(alice.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert alice.health().step == 2

    [(rows, ratios, rule, adv)] = capture
    assert rule == "plain_mean"
    peer = [(r, a) for r, a in zip(rows, adv, strict=True) if r.prompt_id.startswith("q1-")]
    assert len(peer) == 6 and all(r.source_agent == "bob" for r, _ in peer)
    # by hand: plain mean 1/2, σ = stdev(1, 0) ⇒ A = ±(1/2) / (σ + ε)
    step = 0.5 / (statistics.stdev([1.0, 0.0]) + ADV_EPS)
    assert [a for _, a in peer] == pytest.approx([step if r.sample_index == 0 else -step for r, _ in peer], abs=1e-9)
    groups = {pid: i for i, pid in enumerate(dict.fromkeys(r.prompt_id for r in rows))}
    reference = group_advantages_reference([r.reward for r in rows], [groups[r.prompt_id] for r in rows],
                                           [1.0 if r.is_own else 1 / ratios["bob"] for r in rows],
                                           [r.is_own for r in rows], no_own_baseline="plain_mean")
    assert adv == pytest.approx(reference, abs=1e-9)
    with pytest.raises(ValueError, match="no own row"):                # the paper's rule refuses these groups
        row_advantages(rows, ratios, alice.cfg.algo, learner="alice")


def test_bad_peer_batches_cost_only_themselves(make_sites, plans):
    make_plan, make_table = plans
    sites = make_sites(KINDS, screens=ScreenConfig(reverify=False))
    alice, bob = sites.start("alice"), sites.start("bob")
    p1, p2 = make_plan(1), make_plan(2)
    same = pb.RoundPlan()
    same.CopyFrom(p2)
    same.step = 3                                  # plan 2's problems again, as step 3's plan
    clash = make_plan(4)
    clash.prompts[0].prompt_id = "q2-0"            # the own plan's prompt id with another text
    env_b1 = bob.generate(p1).envelope
    env_b3, env_b4, env_b5 = (bob.generate(p).envelope for p in (same, clash, make_plan(5)))
    env_a2, env_b2 = alice.generate(p2).envelope, bob.generate(p2).envelope
    envelopes = [env_a2, env_b2, env_b1, env_b1, env_b3, env_b4, env_b5, _as(sites, "carol", _batch(env_b1))]
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=2, plan=p2, peer_plans=[p1, same, clash],
                                          capabilities=make_table(p2, {"alice": 0.5, "bob": 0.5, "carol": 0.5}),
                                          envelopes=envelopes))

    lines = list(report.rejected)
    assert len(lines) == 4, lines
    assert lines[0] == "bob (step 1): duplicate batch for this step"
    assert lines[1].startswith("bob (step 3): duplicate_sample: 6 rollout(s) already pooled from bob for another "
                               "step's plan (the same problem in two plans)")
    assert lines[2].startswith("bob (step 4): inconsistent_plan: step 4's plan gives prompt 'q2-0' another text")
    assert "the own plan (step 2)" in lines[2]
    assert lines[3].startswith("bob: StaleStepError") and "step 5, expected step 2 or a peer plan's step (1, 3, 4)" \
        in lines[3]
    src = _per_source(report)
    assert src["alice"]["rows"] == 6 and src["bob"]["rows"] == 12 and src["carol"]["rows"] == 6
    assert report.metrics["async/peer_plans"] == 1                      # plan 1 (bob's and carol's batches)
    assert report.metrics["async/peer_plan_rows"] == 12
    assert report.metrics["async/no_own_groups"] == 3
    assert alice.health().step == 2


def test_peer_plans_that_contradict_each_other_are_both_refused(make_sites, plans):
    make_plan, make_table = plans
    sites = make_sites(KINDS, screens=ScreenConfig(reverify=False))
    alice, bob = sites.start("alice"), sites.start("bob")
    p1, p3, p2 = make_plan(1), make_plan(3), make_plan(2)
    p3.prompts[1].prompt_id = "q1-1"               # plan 1's prompt id, another text: neither plan is known right
    env_b1, env_b3 = bob.generate(p1).envelope, bob.generate(p3).envelope
    env_a2, env_b2 = alice.generate(p2).envelope, bob.generate(p2).envelope
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=2, plan=p2, peer_plans=[p1, p3],
                                          capabilities=make_table(p2, {"alice": 0.5, "bob": 0.5}),
                                          envelopes=[env_a2, env_b1, env_b2, env_b3]))
    assert [line.split(": ")[:2] for line in report.rejected] == [["bob (step 1)", "inconsistent_plan"],
                                                                  ["bob (step 3)", "inconsistent_plan"]]
    assert "another peer plan" in report.rejected[0]
    assert _per_source(report)["bob"]["rows"] == 6
    assert report.metrics["async/peer_plans"] == 0 and report.metrics["async/no_own_groups"] == 0


def test_capability_per_task_reads_the_tasks_of_peer_plans(make_sites, plans):
    make_plan, make_table = plans
    sites = make_sites(KINDS, algo=AlgoConfig(capability_scope="task"), screens=ScreenConfig(reverify=False))
    alice, bob = sites.start("alice"), sites.start("bob")
    p1, p2 = make_plan(1), make_plan(2)
    for p, task in ((p1, "words"), (p2, "sums")):
        for q in p.prompts:
            q.task = task
    env_b1 = bob.generate(p1).envelope
    env_a2, env_b2 = alice.generate(p2).envelope, bob.generate(p2).envelope
    table = make_table(p2, {"alice": 0.4, "bob": 0.4})
    caps = {"alice": {"sums": 0.8, "words": 0.4}, "bob": {"sums": 0.2, "words": 0.8}}
    for a in table.agents:
        a.task_capability.update(caps[a.agent_id])
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=2, plan=p2, capabilities=table, peer_plans=[p1],
                                          envelopes=[env_a2, env_b1, env_b2]))
    src = _per_source(report)
    assert not report.rejected and src["bob"]["rows"] == 12
    # 6 rows on sums (own plan) at r = 0.2 / 0.8, 6 on words (the peer plan's task) at r = 0.8 / 0.4
    assert src["bob"]["capability_ratio_rows_mean"] == pytest.approx((6 * 0.25 + 6 * 2.0) / 12)


def test_malformed_peer_plans_refuse_the_order_with_the_weights_unchanged(make_sites, plans):
    make_plan, make_table = plans
    sites = make_sites({"alice": "tiny-llama-bpe"})
    alice = sites.start("alice")
    p2 = make_plan(2)
    env = alice.generate(p2).envelope
    table = make_table(p2, {"alice": 0.5})
    other_run = make_plan(1, run_id="run-b")
    no_prompts = make_plan(1)
    del no_prompts.prompts[:]
    no_samples = make_plan(1, g=0)
    twice = make_plan(1)
    twice.prompts[1].prompt_id = "q1-0"
    cases = [([other_run], "is for run 'run-b'"), ([make_plan(2)], "own step"),
             ([make_plan(1), make_plan(1)], "two peer plans for one step"),
             ([no_prompts], "at least one prompt"), ([no_samples], "samples_per_prompt >= 1"),
             ([twice], "unique within the plan"), ([make_plan(1, max_new_tokens=70_000)], "max_new_tokens <="),
             ([make_plan(s) for s in range(3, 3 + 65)], "at most 64")]
    before, fingerprint = _weights(alice.model), alice.health().model_fingerprint
    for peer_plans, message in cases:
        with pytest.raises(InvalidRequestError, match=message):
            alice.train(wpb.TrainRequest(run_id="run-a", step=2, plan=p2, capabilities=table, envelopes=[env],
                                         peer_plans=peer_plans))
    after = _weights(alice.model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert alice.health().model_fingerprint == fingerprint and alice.health().step == 0
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=2, plan=p2, capabilities=table, envelopes=[env]))
    assert not any(k.startswith("async/") for k in report.metrics)      # a synchronous order: no async metrics
    assert alice.health().step == 2
