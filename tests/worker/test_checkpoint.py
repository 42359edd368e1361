"""Checkpoints: atomic save, exact resume (bit-identical next step), pruning, LoRA, plain HF export."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from hacrl_fed.config import OptimConfig
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb
from hacrl_fed.checkpoints.store import CheckpointError, CheckpointManager, TrainingState, export_hf

KINDS = {"alice": "tiny-llama-bpe", "bob": "tiny-gemma-unigram"}


def _optimizer_with_state(model):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.arange(12).unsqueeze(0) % 50
    model(input_ids=ids).logits.float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    return opt


def _rng_draws():
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_save_load_roundtrip_and_pruning(load_tiny, tmp_path):
    lm = load_tiny("tiny-gemma-unigram")
    opt = _optimizer_with_state(lm.model)
    mgr = CheckpointManager(tmp_path / "ck", keep_last=2)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    paths = [mgr.save(lm.model, opt, TrainingState(step=s, run_id="r", capability=b"\x01cap")) for s in (1, 2, 3)]
    expected_draws = _rng_draws()
    expected = {k: v.clone() for k, v in lm.model.state_dict().items()}
    assert [p.name for p in mgr.checkpoints()] == ["step-00000002", "step-00000003"]
    assert mgr.latest() == paths[-1] and not paths[0].exists()
    assert not [p for p in (tmp_path / "ck").iterdir() if p.name.startswith(".")]

    fresh = load_tiny("tiny-gemma-unigram")
    with torch.no_grad():
        for p in fresh.model.parameters():
            p.add_(1.0)
    fresh_opt = torch.optim.AdamW(list(fresh.model.parameters()), lr=1e-2)
    state = CheckpointManager.load(mgr.latest(), fresh.model, fresh_opt)
    assert (state.step, state.run_id, state.capability) == (3, "r", b"\x01cap")
    for k, v in fresh.model.state_dict().items():
        assert torch.equal(v, expected[k]), k
    assert _rng_draws() == expected_draws
    a, b = opt.state_dict(), fresh_opt.state_dict()
    for pid, st in a["state"].items():
        assert torch.equal(st["exp_avg"], b["state"][pid]["exp_avg"])
        assert torch.equal(st["exp_avg_sq"], b["state"][pid]["exp_avg_sq"])


def test_failed_save_keeps_previous_checkpoint(load_tiny, tmp_path, monkeypatch):
    lm = load_tiny("tiny-llama-bpe")
    mgr = CheckpointManager(tmp_path / "ck")
    good = mgr.save(lm.model, None, TrainingState(step=1, run_id="r"))

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError, match="No space"):
        mgr.save(lm.model, None, TrainingState(step=2, run_id="r"))
    assert mgr.latest() == good and [p.name for p in mgr.checkpoints()] == ["step-00000001"]
    assert not [p for p in (tmp_path / "ck").iterdir() if p.name.startswith(".tmp")]


def test_lora_checkpoint_and_merged_export(load_tiny, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lm = load_tiny("tiny-llama-bpe", lora_rank=4)
    opt = _optimizer_with_state(lm.model)   # moves the adapter away from its zero init
    path = CheckpointManager(tmp_path / "ck").save(lm.model, opt, TrainingState(step=1, run_id="r"))
    assert (path / "adapter.safetensors").is_file() and not (path / "model.safetensors").exists()
    fresh = load_tiny("tiny-llama-bpe", lora_rank=4)
    CheckpointManager.load(path, fresh.model, torch.optim.AdamW([p for p in fresh.model.parameters()
                                                                 if p.requires_grad]))
    ids = torch.tensor([[1, 5, 9, 13, 40, 2]])
    with torch.no_grad():
        live = lm.model(input_ids=ids).logits
        assert torch.equal(fresh.model(input_ids=ids).logits, live)
    with pytest.raises(CheckpointError, match="lora"):
        CheckpointManager.load(path, load_tiny("tiny-llama-bpe").model)

    out = export_hf(lm.model, lm.tokenizer, tmp_path / "export")
    assert hasattr(lm.model, "peft_config")               # the live model keeps its adapter
    plain = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert not any("lora" in k for k in plain.state_dict())
    assert tok("What is 2 + 3?").input_ids == lm.tokenizer("What is 2 + 3?").input_ids
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, live, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["tiny-llama-bpe", "tiny-gemma-unigram"])
def test_export_reloads_with_plain_transformers(load_tiny, tmp_path, kind):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lm = load_tiny(kind)
    out = export_hf(lm.model, lm.tokenizer, tmp_path / "export")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(FileExistsError):
        export_hf(lm.model, lm.tokenizer, tmp_path / "other")
    plain = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tok("Compute 17 * 4, then add 5.").input_ids])
    with torch.no_grad():
        assert torch.equal(plain(input_ids=ids).logits, lm.model(input_ids=ids).logits)
    assert tok.eos_token_id == lm.tokenizer.eos_token_id and tok.pad_token_id == lm.tokenizer.pad_token_id


def _train(worker, plan, make_table, peer_envs=()):
    """Generate on ``worker``, train it on its batch + ``peer_envs``; every sample 0 corrected to reward 1."""
    env = worker.generate(plan).envelope
    batch = pb.RolloutBatch.FromString(env.payload)
    fixes = [(batch.agent_id, r.prompt_id, r.sample_index, 1.0) for r in batch.rollouts if r.sample_index == 0]
    table = make_table(plan, {"alice": 0.3, "bob": 0.6}, corrections=fixes)
    return worker.train(wpb.TrainRequest(run_id=plan.run_id, step=plan.step, plan=plan,
                                         envelopes=[env, *peer_envs], capabilities=table))


@pytest.mark.parametrize("schedule", [{}, {"lr_scheduler_type": "cosine", "schedule_steps": 3}],
                         ids=["constant", "cosine"])
def test_resume_gives_bit_identical_next_step(make_sites, plans, schedule):
    make_plan, make_table = plans
    sites = make_sites(KINDS, optim=OptimConfig(lr=1e-3, mini_batch_rows=4, seed=0, **schedule))
    alice, bob = sites.start("alice"), sites.start("bob")
    p1, p2 = make_plan(1), make_plan(2)
    _train(alice, p1, make_table, [bob.generate(p1).envelope])
    saved = alice.checkpoint(wpb.CheckpointRequest(kind=wpb.CheckpointRequest.SAVE))
    assert saved.step == 1
    bob_step2 = bob.generate(p2).envelope
    reference = _train(alice, p2, make_table, [bob_step2])
    assert reference.metrics["loss"] != 0 and {s.source_agent for s in reference.per_source} == {"alice", "bob"}

    alice.close()                                        # a restart: the old process lets go of its checkpoints
    resumed = sites.start("alice")                       # loads the newest checkpoint (step 1) at start-up
    assert (resumed.health().step, resumed.health().run_id) == (1, "run-a")
    again = _train(resumed, p2, make_table, [bob_step2])
    assert again.metrics["loss"] == reference.metrics["loss"]
    for a, b in zip(again.per_source, reference.per_source):
        assert dict(a.metrics) == dict(b.metrics)
    assert resumed.health().model_fingerprint == alice.health().model_fingerprint   # same weights, bit for bit
    # the schedule continues from the restored step number (the optimizer state holds step 1's lr)
    m = int(again.metrics["updates"])                     # step 2's updates sit at s = 1 + k / m
    assert m > 1
    expected = 1e-3 if not schedule else sum(1e-3 * 0.5 * (1 + math.cos(math.pi * (1 + k / m) / 3)) for k in range(m)) / m
    assert again.metrics["lr"] == pytest.approx(expected, rel=1e-9)
