"""The worker checks everything it trains on, and one bad batch costs only that batch: forwarded peer
batches with bad sample indices, missing samples or no rollouts, peers the capability table misses or
gives unusable numbers, invalid reward corrections — each left out with a reason, the rest trained."""

from __future__ import annotations

import math

from hacrl_fed.protocol.envelope import sign_batch
from hacrl_fed.protocol.keys import load_signing_key
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb

KINDS = {"alice": "tiny-llama-bpe", "bob": "tiny-gemma-unigram", "carol": "tiny-llama-bpe",
         "dave": "tiny-llama-bpe", "erin": "tiny-llama-bpe"}
"""alice and bob run workers; carol, dave and erin only sign (their batches are made from bob's)."""


def _as(sites, agent: str, batch: pb.RolloutBatch, mutate=None) -> pb.SignedEnvelope:
    """``batch`` re-issued by roster agent ``agent`` (optionally altered), signed with its key."""
    out = pb.RolloutBatch()
    out.CopyFrom(batch)
    out.agent_id = agent
    if mutate is not None:
        mutate(out)
    return sign_batch(out, load_signing_key(sites.cfg[agent].private_key))


def _sources(report) -> set[str]:
    return {s.source_agent for s in report.per_source}


def _step(alice, bob, make_plan, step):
    plan = make_plan(step)
    env_a, env_b = alice.generate(plan).envelope, bob.generate(plan).envelope
    return plan, env_a, env_b, pb.RolloutBatch.FromString(env_b.payload)


def test_bad_forwarded_batches_cost_only_themselves(make_sites, plans):
    make_plan, make_table = plans
    sites = make_sites(KINDS)
    alice, bob = sites.start("alice"), sites.start("bob")
    caps = {"alice": 0.5, "bob": 0.5, "carol": 0.5, "dave": 0.5, "erin": 0.5}

    def out_of_range(b):
        b.rollouts[0].sample_index = 99

    def missing(b):
        del b.rollouts[-1]

    def empty(b):
        del b.rollouts[:]

    plan, env_a, env_b, batch_b = _step(alice, bob, make_plan, 1)
    report = alice.train(wpb.TrainRequest(
        run_id="run-a", step=1, plan=plan, capabilities=make_table(plan, caps),
        envelopes=[env_a, env_b, _as(sites, "carol", batch_b, out_of_range), _as(sites, "dave", batch_b, missing),
                   _as(sites, "erin", batch_b, empty)]))
    assert _sources(report) == {"alice", "bob"} and report.step == 1
    reasons = sorted(line.split(": ")[1] for line in report.rejected)
    assert reasons == ["bad_sample_index", "missing_sample", "missing_sample"], report.rejected
    assert alice.health().step == 1

    # a peer the capability table misses (or lists with a NaN) is left out; the step still trains
    plan, env_a, env_b, batch_b = _step(alice, bob, make_plan, 2)
    table = make_table(plan, {"alice": 0.5, "bob": 0.5, "dave": math.nan})
    report = alice.train(wpb.TrainRequest(
        run_id="run-a", step=2, plan=plan, capabilities=table,
        envelopes=[env_a, env_b, _as(sites, "carol", batch_b), _as(sites, "dave", batch_b)]))
    assert _sources(report) == {"alice", "bob"}
    assert sorted(line.split(":")[0] for line in report.rejected) == ["carol", "dave"]
    assert all("no usable entry" in line for line in report.rejected)
    assert alice.health().step == 2

    # an invalid correction drops that peer's batch; of the learner's own rollouts it is ignored
    plan, env_a, env_b, batch_b = _step(alice, bob, make_plan, 3)
    own = pb.RolloutBatch.FromString(env_a.payload).rollouts[0]
    bad = [("bob", batch_b.rollouts[0].prompt_id, 0, math.inf), ("alice", own.prompt_id, own.sample_index, -1.0)]
    table = make_table(plan, {"alice": 0.5, "bob": 0.5})
    for agent, pid, idx, reward in bad:
        table.corrections.add(agent_id=agent, prompt_id=pid, sample_index=idx, reward=reward, verdict=pb.CORRECT)
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=3, plan=plan, capabilities=table,
                                          envelopes=[env_a, env_b]))
    assert _sources(report) == {"alice"}
    assert any(line.startswith("bob: coordinator correction") and "batch left out" in line for line in report.rejected)
    assert any(line.startswith("alice: coordinator correction") and "ignored" in line for line in report.rejected)

    # without a usable capability of the learner itself, no foreign batch can be weighted: own rows only
    plan, env_a, env_b, _ = _step(alice, bob, make_plan, 4)
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=4, plan=plan, envelopes=[env_a, env_b],
                                          capabilities=make_table(plan, {"bob": 0.5})))
    assert _sources(report) == {"alice"} and report.rejected == ["bob: capability table has no usable entry for "
                                                                 "alice; batch left out"]
    assert alice.health().step == 4


def test_envelope_floods_and_odd_key_ids_are_bounded(make_sites, plans):
    make_plan, make_table = plans
    sites = make_sites({"alice": "tiny-llama-bpe", "bob": "tiny-gemma-unigram"})
    alice = sites.start("alice")
    plan = make_plan(1)
    env_a = alice.generate(plan).envelope
    junk = [pb.SignedEnvelope(payload=b"x", signature=b"y" * 64, key_id="\x1b[2J" + "k" * 1000)] * 1000
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[env_a, *junk],
                                          capabilities=make_table(plan, {"alice": 0.5})))
    assert _sources(report) == {"alice"}
    assert len(report.rejected) <= 257 and "more envelope(s) ignored" in report.rejected[-1]
    assert all(len(line) < 400 and "\x1b" not in line.split(":")[0] for line in report.rejected[:-1])


def test_an_expired_train_order_is_refused_and_refusals_are_shown(make_sites, plans, caplog):
    """After a stall the worker refuses an order the coordinator has already recorded as failed; the
    coordinator's notice and every refusal are one warning line of the worker (the site's terminal)."""
    import logging
    import time

    import grpc
    import pytest

    from hacrl_fed.worker.errors import PreconditionError
    from hacrl_fed.worker.service import AgentWorkerServicer

    make_plan, make_table = plans
    sites = make_sites({"alice": "tiny-llama-bpe"})
    alice = sites.start("alice")
    plan = make_plan(1)
    with caplog.at_level(logging.WARNING, logger="hacrl_fed.worker"):
        env = alice.generate(plan, "step 0: your batch was not pooled (bad_signature): \x1b[2Jforged").envelope
    assert any(r.getMessage().startswith("coordinator: step 0: your batch was not pooled") and "\x1b" not in
               r.getMessage() for r in caplog.records)
    fingerprint = alice.health().model_fingerprint
    req = wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[env], deadline_unix_s=time.time() - 5,
                           capabilities=make_table(plan, {"alice": 0.5}))
    with pytest.raises(PreconditionError, match="expired .* not trained"):
        alice.train(req)
    assert alice.health().step == 0 and alice.health().model_fingerprint == fingerprint

    class Aborted(Exception):
        pass

    class Context:
        def abort(self, code, message):
            raise Aborted(code, message)

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hacrl_fed.worker"), pytest.raises(Aborted) as info:
        AgentWorkerServicer(alice).Train(req, Context())
    assert info.value.args[0] == grpc.StatusCode.FAILED_PRECONDITION
    assert [r.getMessage() for r in caplog.records if "refused" in r.getMessage()][0].startswith("train refused: ")
    req.deadline_unix_s = time.time() + 600
    assert alice.train(req).step == 1 and alice.health().step == 1


def test_a_re_sent_train_order_whose_first_copy_was_trained_says_already_trained(make_sites, plans):
    """The order's first copy trained (and generated the next step); its re-sent copy is refused with the
    ALREADY_TRAINED answer the coordinator counts as trained, and the weights are not trained twice."""
    import pytest

    from hacrl_fed.protocol.site_reply import ALREADY_TRAINED
    from hacrl_fed.worker.errors import PreconditionError

    make_plan, make_table = plans
    alice = make_sites({"alice": "tiny-llama-bpe"}).start("alice")
    plan = make_plan(1)
    env = alice.generate(plan).envelope
    req = wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[env],
                           capabilities=make_table(plan, {"alice": 0.5}))
    alice.train(req)
    alice.generate(make_plan(2))                          # the reply that was cut carried the next batch too
    fingerprint = alice.health().model_fingerprint
    with pytest.raises(PreconditionError, match=ALREADY_TRAINED):
        alice.train(req)
    assert alice.health().step == 1 and alice.health().model_fingerprint == fingerprint
