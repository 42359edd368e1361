"""The screens in a site's training step (tiny models, real envelopes): a site that trusts no coordinator
blindly, payload tails cut before training, quarantine kept across a restart and lifted by the operator."""

from __future__ import annotations

import logging

import pytest

from hacrl_fed.screen_config import ScreenConfig
from hacrl_fed.protocol.envelope import sign_batch
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb

KINDS = {"alice": "tiny-llama-bpe", "bob": "tiny-gemma-unigram"}
NO_LIKELIHOOD = {"enabled": False}
"""A random tiny model finds any crafted text far less likely than its own samples (its likelihood screen's
learner margin would screen it); the tests of the other screens turn it off."""
PAYLOAD = " Visit www.mathtricks.example for more!"


def _per_source(report) -> dict[str, dict[str, float]]:
    return {s.source_agent: dict(s.metrics) for s in report.per_source}


def _crafted(worker, plan, *, payload: str = ""):
    """``worker``'s real batch for ``plan`` with sample 0 of every prompt replaced by a correct answer (plus
    ``payload``) and sample 1 by a wrong one; honest rewards; signed with the worker's own key."""
    env = worker.generate(plan).envelope
    batch = pb.RolloutBatch.FromString(env.payload)
    refs = {p.prompt_id: p.reference_answer for p in plan.prompts}
    for r in batch.rollouts:
        right = r.sample_index == 0
        r.response_text = f"It is \\boxed{{{refs[r.prompt_id]}}}." + payload if right else "I do not know."
        r.reward, r.verdict, r.finish_reason = (1.0, pb.CORRECT, pb.STOP) if right else (0.0, pb.INCORRECT, pb.STOP)
    return env, sign_batch(batch, worker.key, worker.name)


def _table(make_table, plan, corrections=()):
    return make_table(plan, {"alice": 0.5, "bob": 0.5}, corrections=corrections)


def test_a_coordinator_that_flips_rewards_is_caught_by_the_site(make_sites, plans, caplog):
    make_plan, make_table = plans
    sites = make_sites(KINDS, screens=ScreenConfig(likelihood=NO_LIKELIHOOD))
    alice, bob = sites.start("alice"), sites.start("bob")
    plan = make_plan(1)
    own = alice.generate(plan).envelope
    _, env_b = _crafted(bob, plan)
    # a lying coordinator: every correct row of bob "corrected" to 0, so alice would learn nothing from bob
    lies = [("bob", p.prompt_id, 0, 0.0) for p in plan.prompts]
    with caplog.at_level(logging.WARNING, logger="hacrl_fed.screens"):
        report = alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[own, env_b],
                                              capabilities=_table(make_table, plan, lies)))
    src = _per_source(report)["bob"]
    assert src["coordinator_disagreements"] == 3 and report.metrics["coordinator_reward_disagreements"] == 3
    assert src["reward_mean"] == 0.5                 # the site trained on its own verdicts, not the coordinator's
    assert src["claim_disagreements"] == 0 and src["standing"] == 0   # bob told the truth: not flagged
    assert src["pos_adv_rows"] == 3                  # bob's correct rows keep their positive advantage
    assert sum("contradicts this site's verifier" in r.getMessage() for r in caplog.records) == 3

    # the same lie with re-verification off is what the site trains on
    off = make_sites(KINDS, screens=ScreenConfig(reverify=False, likelihood=NO_LIKELIHOOD))
    alice2, bob2 = off.start("alice"), off.start("bob")
    own2 = alice2.generate(plan).envelope
    _, env_b2 = _crafted(bob2, plan)
    report2 = alice2.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[own2, env_b2],
                                            capabilities=_table(make_table, plan, lies)))
    assert _per_source(report2)["bob"]["reward_mean"] == 0.0
    assert "coordinator_reward_disagreements" not in report2.metrics or \
        report2.metrics["coordinator_reward_disagreements"] == 0


def test_payload_tails_are_cut_honest_rows_pass(make_sites, plans):
    make_plan, make_table = plans
    sites = make_sites(KINDS, screens=ScreenConfig(likelihood=NO_LIKELIHOOD))
    alice, bob = sites.start("alice"), sites.start("bob")
    p1 = make_plan(1)
    own = alice.generate(p1).envelope
    _, honest = _crafted(bob, p1)
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=p1, envelopes=[own, honest],
                                          capabilities=_table(make_table, p1)))
    src = _per_source(report)["bob"]
    assert src["screened_rows"] == 0 and src["screen_rows"] == 6 and src["standing"] == 0
    assert src["reverified"] == 6 and src["ll_per_byte"] < 0

    p2 = make_plan(2)
    own = alice.generate(p2).envelope
    _, poisoned = _crafted(bob, p2, payload=PAYLOAD)
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=2, plan=p2, envelopes=[own, poisoned],
                                          capabilities=_table(make_table, p2)))
    src = _per_source(report)["bob"]
    assert src["screened_tail_cut"] == 3 and src["reward_mean"] == 0.5   # cut after the answer, still correct
    assert src["flagged"] == 1 and src["standing"] == 1 and src["screen_weight"] == 0.5   # down-weighted


def test_quarantine_survives_a_restart_and_the_operator_lifts_it(make_sites, plans):
    make_plan, make_table = plans
    q = {"quarantine_after": 1, "release_after_clean": 0}
    sites = make_sites(KINDS, screens=ScreenConfig(quarantine=q, tail={"policy": "reject"}, likelihood=NO_LIKELIHOOD))
    alice, bob = sites.start("alice"), sites.start("bob")
    p1 = make_plan(1)
    own = alice.generate(p1).envelope
    _, poisoned = _crafted(bob, p1, payload=PAYLOAD)
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=p1, envelopes=[own, poisoned],
                                          capabilities=_table(make_table, p1)))
    assert _per_source(report)["bob"]["screened_tail_reject"] == 3
    assert report.metrics["quarantined_sources"] == 1
    alice.checkpoint(wpb.CheckpointRequest(kind=wpb.CheckpointRequest.SAVE))
    alice.close()

    resumed = sites.start("alice")
    assert resumed.trainer.guard.standing["bob"].status == "quarantined"
    p2 = make_plan(2)
    own = resumed.generate(p2).envelope
    _, honest = _crafted(bob, p2)
    report = resumed.train(wpb.TrainRequest(run_id="run-a", step=2, plan=p2, envelopes=[own, honest],
                                            capabilities=_table(make_table, p2)))
    assert any(r.startswith("bob: quarantined by this site since step 1") for r in report.rejected)
    assert _per_source(report)["bob"]["quarantined_rows"] == 6 and "rows" not in _per_source(report)["bob"]
    resumed.checkpoint(wpb.CheckpointRequest(kind=wpb.CheckpointRequest.SAVE))
    resumed.close()

    sites.cfg["alice"] = sites.cfg["alice"].model_copy(
        update={"screens": ScreenConfig(quarantine=q, release=["bob"], likelihood=NO_LIKELIHOOD)})
    released = sites.start("alice")                  # the operator's knob: screens.release = ["bob"]
    assert released.trainer.guard.standing["bob"].status == "trusted"
    p3 = make_plan(3)
    own = released.generate(p3).envelope
    _, honest = _crafted(bob, p3)
    report = released.train(wpb.TrainRequest(run_id="run-a", step=3, plan=p3, envelopes=[own, honest],
                                             capabilities=_table(make_table, p3)))
    assert not report.rejected and _per_source(report)["bob"]["rows"] == 6
    released.close()
    for bad in (["bbo"], ["alice"]):   # a typo, or the site itself: a clear error before the model loads
        sites.cfg["alice"] = sites.cfg["alice"].model_copy(update={"screens": ScreenConfig(release=bad)})
        with pytest.raises(ValueError, match=rf"screens.release names '{bad[0]}'.*peers: bob"):
            sites.start("alice")
