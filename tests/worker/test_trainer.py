"""The worker's training step: envelope checks, reward corrections, capability ratios, isolated recipes."""

from __future__ import annotations

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.screen_config import ScreenConfig
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
    with pytest.raises(PreconditionError, match="already trained"):   # step 2 is in the weights: not again
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


@pytest.mark.parametrize("update_mode", ["train", "eval"])
def test_update_runs_in_the_configured_module_mode(make_sites, plans, update_mode):
    from hacrl_fed.config import OptimConfig

    make_plan, make_table = plans
    sites = make_sites({"alice": KINDS["alice"]}, optim=OptimConfig(lr=1e-3, mini_batch_rows=8, seed=0,
                                                                    update_mode=update_mode))
    alice = sites.start("alice")
    plan = make_plan(1)
    env = alice.generate(plan).envelope
    modes: list[bool] = []
    hook = alice.model.model.register_forward_pre_hook(lambda m, _: modes.append(m.training))
    fixes = [("alice", r.prompt_id, r.sample_index, 1.0) for r in pb.RolloutBatch.FromString(env.payload).rollouts
             if r.sample_index == 0]
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[env],
                                          capabilities=make_table(plan, {"alice": 0.5}, corrections=fixes)))
    hook.remove()
    assert modes and set(modes) == {update_mode == "train"}
    assert not alice.model.training                       # generation and evaluation stay in eval mode
    # the tiny models have no dropout: an own row's ratio is 1 in either mode
    assert _per_source(report)["alice"]["s_mean"] == pytest.approx(1.0, abs=1e-4)
    assert report.metrics["entropy"] > 0 and report.metrics["lr"] == 1e-3


def test_weighted_rewards_are_computed_by_the_learner_for_every_row(make_sites, plans, tmp_path, monkeypatch):
    from hacrl_fed.config import RewardFuncConfig

    (tmp_path / "site_shaping.py").write_text(
        "def length_bucket(prompts, completions, source_agent, **kw):\n"
        "    return [float(len(c) % 3) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    make_plan, make_table = plans
    funcs = [RewardFuncConfig(name="accuracy"), RewardFuncConfig(name="site_shaping:length_bucket", weight=0.25)]
    sites = make_sites(KINDS, reward_funcs=funcs, screens=ScreenConfig(reverify=False))  # trains the corrections
    alice, bob = sites.start("alice"), sites.start("bob")
    plan = make_plan(1)
    env_a, env_b = alice.generate(plan).envelope, bob.generate(plan).envelope
    fixes = _corrections(env_b, "bob", every=2)
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[env_a, env_b],
                                          capabilities=make_table(plan, {"alice": 0.5, "bob": 0.5}, corrections=fixes)))
    batch_b = pb.RolloutBatch.FromString(env_b.payload)
    assert all(r.reward in (0.0, 1.0) for r in batch_b.rollouts)     # the wire carries the accuracy alone
    fixed = {(pid, idx) for _, pid, idx, _ in fixes}
    accuracy = [1.0 if (r.prompt_id, r.sample_index) in fixed else r.reward for r in batch_b.rollouts]
    shaped = [a + 0.25 * (len(r.response_text) % 3) for a, r in zip(accuracy, batch_b.rollouts)]
    assert _per_source(report)["bob"]["reward_mean"] == pytest.approx(sum(shaped) / len(shaped))
    assert "reward/length_bucket_mean" in report.metrics and "reward/accuracy_mean" in report.metrics


def test_kl_free_presets_build_no_reference_model(make_sites):
    """gspo / grpo / gspo_x2 have no KL term (kl_coef 0): no frozen copy, no reference forward; hacpo keeps its own."""
    sites = make_sites({"alice": "tiny-llama-bpe", "bob": "tiny-llama-bpe", "carol": "tiny-llama-bpe"})
    sites.cfg["alice"].algo = AlgoConfig.preset("gspo")
    sites.cfg["bob"].algo = AlgoConfig.preset("hacpo")
    sites.cfg["carol"].algo = AlgoConfig.preset("gspo", kl_coef=0.01)
    alice, bob, carol = sites.start("alice"), sites.start("bob"), sites.start("carol")
    assert alice.trainer.ref_model is None
    for worker in (bob, carol):
        ref = worker.trainer.ref_model
        assert ref is not None and ref is not worker.model and not any(p.requires_grad for p in ref.parameters())


@pytest.mark.parametrize(("mode", "autocast", "used"), [("generation", "none", "generation"),
                                                       ("teacher_forced", "none", "teacher_forced"),
                                                       ("auto", "bfloat16", "teacher_forced")])
@pytest.mark.parametrize(("kind", "recipe"), [("tiny-llama-bpe", "hacpo"), ("tiny-gemma-unigram", "gspo")])
def test_own_rows_are_on_policy_at_the_first_update(make_sites, plans, mode, autocast, used, kind, recipe):
    """Whichever pass gave the behaviour log-probs (under bf16 autocast: ``auto`` = the trainer's layout), the
    trainer's first forward reproduces them: every own row's sequence ratio s is 1 up to float rounding before
    the first optimizer step (all rows in one update). Measured under bf16 autocast the generation pass is off
    by up to 2.6e-4 in s here, close to GSPO's 3e-4 clip: why ``auto`` does not use it there."""
    from hacrl_fed.config import OptimConfig

    make_plan, make_table = plans
    sites = make_sites({"alice": kind}, model_kw={"behaviour_logprobs": mode, "autocast": autocast},
                       optim=OptimConfig(lr=1e-3, mini_batch_rows=64, seed=0))
    sites.cfg["alice"].algo = AlgoConfig.preset(recipe)
    alice = sites.start("alice")
    assert alice.engine.behaviour_logprobs == used
    plan = make_plan(1, max_new_tokens=16)
    env = alice.generate(plan).envelope
    table = make_table(plan, {"alice": 0.5}, corrections=_corrections(env, "alice"))
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[env], capabilities=table))
    own = _per_source(report)["alice"]
    assert report.metrics["updates"] == 1 and own["rows"] == 6 and own["grad_frac"] > 0
    assert abs(own["s_min"] - 1) < 1e-5 and abs(own["s_max"] - 1) < 1e-5


def test_fingerprint_is_chained_per_step_not_rehashed(make_sites, plans, monkeypatch, tmp_path):
    """A training step publishes lineage(previous, update) without hashing a weight (a resumed worker publishes
    the same value: tests/worker/test_checkpoint.py); a checkpoint records the content hash (for the resume check)
    beside the published value; a refused train keeps it; one that fails mid-way falls back to hashing the weights."""
    import json
    from pathlib import Path

    import hacrl_fed.worker.agent as agent_mod
    from hacrl_fed.worker.models import model_fingerprint

    make_plan, make_table = plans
    alice = make_sites({"alice": "tiny-llama-bpe"}).start("alice")
    start = alice.health().model_fingerprint
    assert start == model_fingerprint(alice.model)                       # content hash at load
    plan = make_plan(1)
    env = alice.generate(plan).envelope
    table = make_table(plan, {"alice": 0.5}, corrections=_corrections(env, "alice"))
    req = wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[env], capabilities=table)
    with monkeypatch.context() as m:
        calls = []
        m.setattr(agent_mod, "model_fingerprint", lambda model: calls.append(model) or "sha256:never")
        alice.train(req)
        assert calls == []                                               # nothing re-hashed per step
    published = alice.health().model_fingerprint
    assert published.startswith("lineage:") and published != start
    with pytest.raises(PreconditionError):
        alice.train(req)                                                 # refused: no own rollouts of step 1 left
    assert alice.health().model_fingerprint == published
    plan2 = make_plan(2)
    assert pb.RolloutBatch.FromString(alice.generate(plan2).envelope.payload).model_fingerprint == published

    saved = alice.checkpoint(wpb.CheckpointRequest(kind=wpb.CheckpointRequest.SAVE, path="ck"))  # in the site
    meta = json.loads((Path(saved.path) / "state.json").read_text())
    assert meta["fingerprint"] == model_fingerprint(alice.model) != published
    assert meta["extra"]["published_fingerprint"] == published == alice.health().model_fingerprint

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")
    monkeypatch.setattr(alice.trainer, "train_step", broken)
    with pytest.raises(RuntimeError):
        alice.train(wpb.TrainRequest(run_id="run-a", step=2, plan=plan2, envelopes=[env], capabilities=table))
    assert alice.health().model_fingerprint == model_fingerprint(alice.model)


def test_capability_per_task_weights_each_prompts_peer_rows_by_its_tasks_ratio(make_sites, plans):
    make_plan, make_table = plans
    sites = make_sites(KINDS, algo=AlgoConfig(capability_scope="task"), screens=ScreenConfig(reverify=False))
    alice, bob = sites.start("alice"), sites.start("bob")
    plan = make_plan(1, prompts=3, g=2)
    for i, p in enumerate(plan.prompts):
        p.task = "sums" if i < 2 else "words"
    env_a, env_b = alice.generate(plan).envelope, bob.generate(plan).envelope
    table = make_table(plan, {"alice": 0.4, "bob": 0.4})
    caps = {"alice": {"sums": 0.8, "words": 0.1}, "bob": {"sums": 0.2}}   # bob has no value for words yet
    for a in table.agents:
        a.task_capability.update(caps[a.agent_id])
    report = alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, capabilities=table,
                                          envelopes=[env_a, env_b]))
    src = _per_source(report)
    assert src["bob"]["capability_ratio"] == pytest.approx(1.0)               # the global r_{bob→alice}
    # 4 rows on sums at r = 0.2 / 0.8, 2 rows on words at the global ratio 1
    assert src["bob"]["capability_ratio_rows_mean"] == pytest.approx((4 * 0.25 + 2 * 1.0) / 6)
    assert not report.rejected
