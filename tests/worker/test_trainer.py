"""The worker's training step: envelope checks, reward corrections, capability ratios, isolated recipes."""

from __future__ import annotations

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.algo.screens import ScreenConfig
from hacrl_fed.protocol.envelope import sign_batch
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb
from hacrl_fed.worker.errors import PreconditionError

KINDS = {"alice": "tiny-llama-bpe", "bob": "tiny-gemma-unigram"}


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _per_source(report) -> dict[str, dict[str, float]]:
    return {s.source_agent: dict(s.metrics) for s in report.per_source}


def _corrections(batch_env, agent: str, every: int = 2):
    """Reward 1 for every ``every``-th rollout of ``agent``: variance inside every prompt group."""
    batch = pb.RolloutBatch.FromString(batch_env.payload)
    return [(agent, r.prompt_id, r.sample_index, 1.0) for r in batch.rollouts if r.sample_index % every == 0]


def test_train_step_two_agents(make_sites, plans):
    make_plan, make_table = plans
    # the coordinator's corrections are what this test trains on: the site's own re-verification (on by
    # default, tests/worker/test_screens_trainer.py) would replace them with its verdict
    sites = make_sites(KINDS, screens=ScreenConfig(reverify=False))
    alice, bob = sites.start("alice"), sites.start("bob")
    plan = make_plan(1)
    env_a, env_b = alice.generate(plan).envelope, bob.generate(plan).envelope
    batch_a = pb.RolloutBatch.FromString(env_a.payload)
    assert batch_a.model_fingerprint == alice.health().model_fingerprint
    assert len(batch_a.rollouts) == 3 * 2

    tampered = pb.SignedEnvelope()
    tampered.CopyFrom(env_b)
    tampered.payload = env_b.payload.replace(b"run-a", b"run-b")
    forged_batch = pb.RolloutBatch.FromString(env_b.payload)
    forged_batch.agent_id = "mallory"
    forged = sign_batch(forged_batch, Ed25519PrivateKey.generate(), "mallory")
    table = make_table(plan, {"alice": 0.2, "bob": 0.5}, corrections=_corrections(env_b, "bob", every=1))
    before = _weights(alice.model)
    fp_before = alice.health().model_fingerprint
    req = wpb.TrainRequest(run_id="run-a", step=1, plan=plan, capabilities=table,
                           envelopes=[env_a, tampered, forged, env_b])
    report = alice.train(req)

    assert report.agent_id == "alice" and report.step == 1
    assert len(report.rejected) == 2
    assert any(r.startswith("bob: BadSignatureError") for r in report.rejected)
    assert any(r.startswith("mallory: UnknownKeyError") for r in report.rejected)
    src = _per_source(report)
    assert set(src) == {"alice", "bob"}
    assert src["alice"]["rows"] == 6 and src["bob"]["rows"] == 6
    assert src["bob"]["reward_mean"] == 1.0            # every bob rollout corrected to 1
    assert src["bob"]["capability_ratio"] == pytest.approx(2.5)   # r_{bob→alice} = 0.5 / 0.2
    assert src["alice"]["s_mean"] == pytest.approx(1.0, abs=1e-4)  # own rows: behaviour = pre-update policy
    assert "token_ratio_mean" in src["bob"] and src["bob"]["tokens"] > 0
    for key in ("loss", "kl", "grad_norm", "time/update_s", "rss_bytes", "zero_variance_group_frac"):
        assert key in report.metrics
    after = _weights(alice.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert alice.health().model_fingerprint != fp_before
    assert alice.health().step == 1

    # bob trains on the same pool (own rows = its own ids), warm-up forces ratio 1
    report_b = bob.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[env_a, env_b],
                                          capabilities=make_table(plan, {"alice": 0.2, "bob": 0.5}, warmup=True)))
    assert _per_source(report_b)["alice"]["capability_ratio"] == 1.0
    assert not report_b.rejected


def test_ratio_clip_and_replay_rejected(make_sites, plans):
    make_plan, make_table = plans
    sites = make_sites(KINDS, algo=AlgoConfig(ratio_clip=(0.5, 2.0)))
    alice, bob = sites.start("alice"), sites.start("bob")
    p1 = make_plan(1, g=1)
    a1, b1 = alice.generate(p1).envelope, bob.generate(p1).envelope
    alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=p1, envelopes=[a1, b1],
                                 capabilities=make_table(p1, {"alice": 0.5, "bob": 0.5})))
    p2 = make_plan(2, g=1)
    a2 = alice.generate(p2).envelope
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=2, plan=p2, envelopes=[a2, b1],
                                          capabilities=make_table(p2, {"alice": 0.01, "bob": 0.9})))
    assert report.rejected and "StaleStepError" in report.rejected[0]
    assert set(_per_source(report)) == {"alice"}
    b2 = bob.generate(p2).envelope
    with pytest.raises(PreconditionError, match="no own rollouts"):   # step 2 already trained
        alice.train(wpb.TrainRequest(run_id="run-a", step=2, plan=p2, envelopes=[a2, b2],
                                     capabilities=make_table(p2, {"alice": 0.01, "bob": 0.9})))
    p3 = make_plan(3, g=1)
    a3, b3 = alice.generate(p3).envelope, bob.generate(p3).envelope
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=3, plan=p3, envelopes=[a3, b3],
                                          capabilities=make_table(p3, {"alice": 0.01, "bob": 0.9})))
    assert _per_source(report)["bob"]["capability_ratio"] == 2.0   # 90 clipped to the upper bound


def test_isolated_recipe_ignores_foreign_rows(make_sites, plans):
    make_plan, make_table = plans
    sites = make_sites(KINDS, algo=AlgoConfig.preset("gspo_x2"))
    alice, bob = sites.start("alice"), sites.start("bob")
    plan = make_plan(1, g=2)
    env_a = alice.generate(plan).envelope
    published = pb.RolloutBatch.FromString(env_a.payload).rollouts
    assert len(published) == 3 * 2                       # only the plan's G per prompt is published
    assert {r.sample_index for r in published} == {0, 1}
    env_b = bob.generate(plan).envelope
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[env_a, env_b],
                                          capabilities=make_table(plan, {}, corrections=_corrections(env_a, "alice"))))
    assert set(_per_source(report)) == {"alice"}
    assert report.metrics["ignored_batches"] == 1
    assert _per_source(report)["alice"]["rows"] == 3 * 2 * 2   # trained on rollout_multiplier × G own rows


def test_train_preconditions(make_sites, plans):
    make_plan, make_table = plans
    sites = make_sites(KINDS)
    alice, bob = sites.start("alice"), sites.start("bob")
    plan = make_plan(1)
    with pytest.raises(PreconditionError, match="call Generate"):
        alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, capabilities=make_table(plan, {})))
    env_a, env_b = alice.generate(plan).envelope, bob.generate(plan).envelope
    altered = pb.SignedEnvelope()
    altered.CopyFrom(env_a)
    altered.payload = env_a.payload + b"\x00"
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[altered],
                                          capabilities=make_table(plan, {"alice": 0.3})))
    assert report.rejected == ["alice: own batch differs from the one this worker signed"]
    with pytest.raises(PreconditionError, match="run 'run-a'"):
        alice.generate(make_plan(2, run_id="other-run"))
    with pytest.raises(PreconditionError, match="already trained"):
        alice.generate(make_plan(1))


def test_foreign_rollout_without_tokens_is_dropped_not_fatal(make_sites, plans):
    from hacrl_fed.protocol.keys import load_signing_key

    make_plan, make_table = plans
    sites = make_sites(KINDS)
    alice, bob = sites.start("alice"), sites.start("bob")
    plan = make_plan(1)
    env_a, env_b = alice.generate(plan).envelope, bob.generate(plan).envelope
    batch = pb.RolloutBatch.FromString(env_b.payload)
    batch.rollouts[0].response_text = ""                      # e.g. only special tokens, stripped
    batch.rollouts[0].finish_reason = pb.LENGTH
    resigned = sign_batch(batch, load_signing_key(sites.cfg["bob"].private_key))
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[env_a, resigned],
                                          capabilities=make_table(plan, {"alice": 0.5, "bob": 0.5})))
    assert report.metrics["dropped_empty_rows"] == 1
    assert _per_source(report)["bob"]["rows"] == 5 and not report.rejected


def test_published_eos_logprobs_and_truncated_foreign_rows(make_sites, plans):
    """STOP rollouts carry the behaviour EOS log-prob apart; a foreign row the learner would have to cut at
    its ``max_response_tokens`` is left out of training (no consistent ratio) and counted per source."""
    make_plan, make_table = plans
    sites = make_sites(KINDS)
    alice, bob = sites.start("alice"), sites.start("bob")
    plan = make_plan(1, max_new_tokens=24)
    env_a, env_b = alice.generate(plan).envelope, bob.generate(plan).envelope
    for env in (env_a, env_b):
        for r in pb.RolloutBatch.FromString(env.payload).rollouts:
            assert r.HasField("behaviour_eos_logprob") == (r.finish_reason == pb.STOP)
            if r.finish_reason == pb.STOP:
                assert r.behaviour_logprob_sum <= r.behaviour_eos_logprob <= 0.0
    alice.trainer.max_response_tokens = 3          # every foreign view of bob's text is longer than 3 tokens
    bob_rows = pb.RolloutBatch.FromString(env_b.payload).rollouts
    long = sum(len(alice.tokenizer(" " + r.response_text.lstrip(), add_special_tokens=False).input_ids)
               + (r.finish_reason == pb.STOP) > 3 for r in bob_rows)
    assert long > 0
    table = make_table(plan, {"alice": 0.5, "bob": 0.5}, corrections=_corrections(env_b, "bob"))
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, capabilities=table,
                                          envelopes=[env_a, env_b]))
    assert report.metrics["dropped_truncated_rows"] == long
    src = _per_source(report)
    assert src["bob"]["dropped_truncated"] == long
    assert src.get("bob", {}).get("rows", 0.0) == len(bob_rows) - long
    # own rows longer than the cap are kept, their behaviour sums re-summed over the kept prefix: s = 1
    assert src["alice"]["s_mean"] == pytest.approx(1.0, abs=1e-4)
