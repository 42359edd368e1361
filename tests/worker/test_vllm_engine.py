"""The vLLM rollout engine's adapter logic against objects with vLLM's documented fields (``fake_vllm``).

What is tested here: the mapping of ``RequestOutput`` / ``CompletionOutput`` to ``GeneratedSample`` (order, EOS
convention, stop-string cut), the behaviour log-prob bookkeeping (vLLM's values vs the training model's), the
weight sync into fused vLLM-style parameters and its version checks, sleep / wake order, LoRA adapters by version.
The real-vllm test at the end is marked ``gpu`` and skipped where vllm is absent.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from fake_vllm import CompletionOutput, FakeLLM, Logprob, LoRARequest, SamplingParams, random_responder

from hacrl_fed.tokenization.retokenize import cut_at_stop_strings
from hacrl_fed.rollout.engine import HFRolloutEngine, Sampling
from hacrl_fed.worker.engines import build_engine
from hacrl_fed.rollout.vllm_engine import (
    VLLMRolloutEngine,
    VLLMSettings,
    VLLMUnavailableError,
    WeightSyncError,
    completion_response,
    sampling_kwargs,
    vllm_available,
)

KIND = "tiny-llama-bpe"


def _engine(lm, tmp_path, responder=None, *, settings=None, shuffle=False, **kw) -> VLLMRolloutEngine:
    llm = FakeLLM(lm.model if not settings or not settings.lora_rank else lm.model.get_base_model(),
                  responder or random_responder(lm.tokenizer.vocab_size), shuffle=shuffle)
    return VLLMRolloutEngine(lm.model, lm.tokenizer, settings=settings or VLLMSettings(dtype="float32"),
                             model_path="unused", work_dir=tmp_path / "vllm", llm=llm, sampling_params=SamplingParams,
                             lora_request=LoRARequest, **kw)


def _eos(lm) -> int:
    return int(lm.tokenizer.eos_token_id)


# ----------------------------------------------------------------------------------- one completion


def test_a_response_that_stopped_on_eos_keeps_it_with_its_logprob(load_tiny):
    lm = load_tiny(KIND)
    eos = _eos(lm)
    ids, finish, lps = completion_response([11, 12, eos], [{11: Logprob(-1.0)}, {12: Logprob(-2.0)}, {eos: Logprob(-0.1)}],
                                           "stop", None, tokenizer=lm.tokenizer, eos_ids=[eos], stop_strings=(),
                                           max_new_tokens=8)
    assert (ids, finish, lps) == ([11, 12, eos], "stop", [-1.0, -2.0, -0.1])


def test_an_eos_vllm_did_not_return_is_appended_and_the_row_rescored(load_tiny):
    lm = load_tiny(KIND)
    eos = _eos(lm)
    ids, finish, lps = completion_response([11, 12], [{11: Logprob(-1.0)}, {12: Logprob(-2.0)}], "stop", eos,
                                           tokenizer=lm.tokenizer, eos_ids=[eos], stop_strings=(), max_new_tokens=8)
    assert (ids, finish, lps) == ([11, 12, eos], "stop", None)


def test_a_length_response_keeps_max_new_tokens_ids_and_its_logprobs(load_tiny):
    lm = load_tiny(KIND)
    eos = _eos(lm)
    got = completion_response([5, 6, 7], [{t: Logprob(-0.25)} for t in (5, 6, 7)], "length", None,
                              tokenizer=lm.tokenizer, eos_ids=[eos], stop_strings=(), max_new_tokens=3)
    assert got == ([5, 6, 7], "length", [-0.25] * 3)


def test_a_stop_string_is_cut_as_the_hf_engine_cuts_it(load_tiny):
    lm = load_tiny(KIND)
    tok, eos = lm.tokenizer, _eos(lm)
    body = tok.encode("The answer is 4.", add_special_tokens=False)
    tail = tok.encode("\nQuestion: next", add_special_tokens=False)
    sampled = body + tail
    lps = [{t: Logprob(-0.5)} for t in sampled]
    ids, finish, per_token = completion_response(sampled, lps, "stop", "\nQuestion:", tokenizer=tok, eos_ids=[eos],
                                                 stop_strings=["\nQuestion:"], max_new_tokens=64)
    assert (ids, finish) == tuple(cut_at_stop_strings(tok, sampled, "length", ["\nQuestion:"], eos))
    assert ids[-1] == eos and finish == "stop"
    assert "Question" not in tok.decode(ids[:-1])
    assert per_token is None, "the EOS the cut appended was never sampled: the row must be re-scored"


def test_a_stop_string_vllm_held_back_still_ends_the_response_with_eos(load_tiny):
    lm = load_tiny(KIND)
    tok, eos = lm.tokenizer, _eos(lm)
    body = tok.encode("The answer is 4.", add_special_tokens=False)
    ids, finish, per_token = completion_response(body, [{t: Logprob(-0.5)} for t in body], "stop", "\nQuestion:",
                                                 tokenizer=tok, eos_ids=[eos], stop_strings=["\nQuestion:"],
                                                 max_new_tokens=64)
    assert (ids, finish, per_token) == (body + [eos], "stop", None)


@pytest.mark.parametrize("bad", ["missing", "nan", "short"])
def test_logprobs_that_do_not_cover_every_sampled_token_are_not_used(load_tiny, bad):
    lm = load_tiny(KIND)
    eos = _eos(lm)
    lps = {"missing": [{5: Logprob(-1.0)}, {99: Logprob(-1.0)}],
           "nan": [{5: Logprob(-1.0)}, {6: Logprob(math.nan)}],
           "short": [{5: Logprob(-1.0)}]}[bad]
    _, _, per_token = completion_response([5, 6], lps, "length", None, tokenizer=lm.tokenizer, eos_ids=[eos],
                                          stop_strings=(), max_new_tokens=2)
    assert per_token is None


def test_an_aborted_response_is_an_error(load_tiny):
    lm = load_tiny(KIND)
    with pytest.raises(ValueError, match="unfinished"):
        completion_response([5], None, "abort", None, tokenizer=lm.tokenizer, eos_ids=[_eos(lm)], stop_strings=(),
                            max_new_tokens=4)


def test_sampling_parameters_map_to_vllms_documented_keywords():
    sp = Sampling(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=33)
    kw = sampling_kwargs(sp, 4, 123, stop_strings=["\nQuestion:"], eos_ids=[2, 7], logprobs=True)
    SamplingParams(**kw)                                   # only documented fields
    assert kw | {} == kw and (kw["n"], kw["temperature"], kw["top_p"], kw["top_k"], kw["max_tokens"]) == (4, 0.7, 0.9, 20, 33)
    assert kw["stop"] == ["\nQuestion:"] and kw["stop_token_ids"] == [2, 7] and kw["seed"] == 123
    assert kw["logprobs"] == 0 and kw["repetition_penalty"] == 1.0 and kw["min_p"] == 0.0
    plain = sampling_kwargs(sp, 1, 0, stop_strings=(), eos_ids=[2], logprobs=False)
    assert "logprobs" not in plain and "stop" not in plain


# ----------------------------------------------------------------------------------- generate


def test_samples_come_back_prompt_major_with_the_shared_text(load_tiny, render_prompts, tmp_path):
    lm = load_tiny(KIND)
    prompts = render_prompts(lm.tokenizer)
    eng = _engine(lm, tmp_path, shuffle=True)             # vLLM's completions in reverse index order
    out = eng.generate(prompts, 3, Sampling(max_new_tokens=6), seed=4)
    assert [(s.prompt_index, s.sample_index) for s in out] == [(p, i) for p in range(4) for i in range(3)]
    for s in out:
        assert s.prompt_ids == tuple(prompts[s.prompt_index]) and s.token_count == len(s.response_ids) == 6
        assert s.text == lm.tokenizer.decode(list(s.response_ids), skip_special_tokens=True,
                                             clean_up_tokenization_spaces=False)
    params = eng.llm.calls[-1]["params"]
    streams = [p.seed + j for p in params for j in range(p.n)]        # vLLM seeds sample j with seed + j
    assert len(set(streams)) == len(streams) == 12, "no two samples of a call share a random stream"
    again = _engine(lm, tmp_path / "b").generate(prompts, 3, Sampling(max_new_tokens=6), seed=4)
    assert sorted(s.response_ids for s in again) == sorted(s.response_ids for s in out)


def test_the_same_prompt_twice_in_one_call_draws_different_samples(load_tiny, render_prompts, tmp_path):
    lm = load_tiny(KIND)
    prompt = render_prompts(lm.tokenizer)[0]
    out = _engine(lm, tmp_path).generate([prompt, prompt], 2, Sampling(max_new_tokens=8), seed=3)
    assert len({s.response_ids for s in out}) == 4


def test_an_answer_for_another_prompt_or_missing_samples_is_an_error(load_tiny, render_prompts, tmp_path):
    lm = load_tiny(KIND)
    prompts = render_prompts(lm.tokenizer)[:1]
    base = random_responder(lm.tokenizer.vocab_size)
    eng = _engine(lm, tmp_path, lambda p, sp, i: base(p, sp, i)[:-1])
    with pytest.raises(RuntimeError, match="expected 0..2"):
        eng.generate(prompts, 3, Sampling(max_new_tokens=4), seed=0)
    eng = _engine(lm, tmp_path / "b")
    real = eng.llm.generate

    def other_prompt(prompts_, **kw):
        outs = real(prompts_, **kw)
        outs[0].prompt_token_ids = outs[0].prompt_token_ids[1:]
        return outs

    eng.llm.generate = other_prompt
    with pytest.raises(RuntimeError, match="another prompt"):
        eng.generate(prompts, 3, Sampling(max_new_tokens=4), seed=0)


def test_auto_takes_behaviour_logprobs_from_the_training_model(load_tiny, render_prompts, tmp_path):
    lm = load_tiny(KIND)
    prompts = render_prompts(lm.tokenizer)[:2]
    eng = _engine(lm, tmp_path, random_responder(lm.tokenizer.vocab_size, logprob=-99.0))
    assert eng.behaviour_logprobs == "teacher_forced"
    out = eng.generate(prompts, 2, Sampling(max_new_tokens=5), seed=1)
    assert all("logprobs" not in p.kw for p in eng.llm.calls[-1]["params"]), "vLLM's log-probs are not asked for"
    hf = HFRolloutEngine(lm.model, lm.tokenizer)
    want = hf.score([s.prompt_ids for s in out], [s.response_ids for s in out])
    for s, (total, count, per_token) in zip(out, want):
        assert s.logprob_sum == total and s.token_count == count and s.token_logprobs == per_token


def test_generation_mode_uses_vllms_logprobs_and_rescores_rows_it_cannot_cover(load_tiny, render_prompts, tmp_path):
    lm = load_tiny(KIND)
    tok, eos = lm.tokenizer, _eos(lm)
    prompts = render_prompts(tok)[:1]
    body = tok.encode("It is 5.", add_special_tokens=False)
    cut = body + tok.encode("\nQuestion: more", add_special_tokens=False)

    def respond(prompt, sp, _):
        lp = (lambda ids: [{t: Logprob(-0.5)} for t in ids]) if sp.kw.get("logprobs") is not None else (lambda ids: None)
        return [CompletionOutput(0, "", body + [eos], None, lp(body + [eos]), "stop", None),
                CompletionOutput(1, "", cut, None, lp(cut), "stop", "\nQuestion:")]

    eng = _engine(lm, tmp_path, respond, behaviour_logprobs="generation", stop_strings=["\nQuestion:"])
    plain, stopped = eng.generate(prompts, 2, Sampling(max_new_tokens=32), seed=0)
    assert plain.token_logprobs == (-0.5,) * len(body + [eos]) and plain.logprob_sum == -0.5 * (len(body) + 1)
    assert stopped.response_ids[-1] == eos and stopped.finish_reason == "stop"
    want = HFRolloutEngine(lm.model, lm.tokenizer).score(prompts, [stopped.response_ids])[0]
    assert stopped.logprob_sum == want[0] and stopped.token_logprobs == want[2]
    # top-p < 1: vLLM's processed log-probs are truncated, not the behaviour policy's: not asked for, re-scored
    eng.generate(prompts, 2, Sampling(top_p=0.9, max_new_tokens=32), seed=0)
    assert all("logprobs" not in p.kw for p in eng.llm.calls[-1]["params"])


def test_a_request_longer_than_max_model_len_is_refused_before_vllm_sees_it(load_tiny, render_prompts, tmp_path):
    lm = load_tiny(KIND)
    eng = _engine(lm, tmp_path, settings=VLLMSettings(dtype="float32", max_model_len=40))
    with pytest.raises(ValueError, match="max_model_len 40"):
        eng.generate(render_prompts(lm.tokenizer)[:1], 1, Sampling(max_new_tokens=64), seed=0)
    assert eng.llm.calls == []


# ----------------------------------------------------------------------------------- weight sync


def _update(model, seed: int = 0) -> None:
    """A real optimizer step on the training model (what the trainer does between generations)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (1, 12), generator=g)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    model.eval()


def test_vllm_holds_the_training_models_weights_after_every_update(load_tiny, render_prompts, tmp_path):
    lm = load_tiny(KIND)
    prompts = render_prompts(lm.tokenizer)[:1]
    eng = _engine(lm, tmp_path)
    fused = eng.llm.model
    eng.generate(prompts, 1, Sampling(max_new_tokens=3), seed=0)
    assert eng.sync_count == 1, "the first generation syncs (a resumed checkpoint is what generates)"
    eng.generate(prompts, 1, Sampling(max_new_tokens=3), seed=0)
    assert eng.sync_count == 1, "no update, no sync"
    for step in range(2):
        eng.prepare_update()
        _update(lm.model, seed=step)
        eng.weights_updated()
        eng.generate(prompts, 1, Sampling(max_new_tokens=3), seed=0)
        assert eng.sync_count == 2 + step
        for name, p in lm.model.named_parameters():
            assert torch.equal(fused.tensor(name), p.detach()), name
    q = "model.layers.0.self_attn.q_proj.weight"
    assert fused.slices[q][0].endswith("qkv_proj.weight"), "the stand-in really fuses q/k/v"
    assert ("reset_prefix_cache",) in eng.llm.events


def test_each_sync_and_the_version_each_generation_used_are_logged(load_tiny, render_prompts, tmp_path, caplog):
    """The worker's log shows which weights generated: a sync line per version, and per generation the version the
    vLLM workers report holding (what docs/engines.md, "A federation with a vLLM site", reads)."""
    lm = load_tiny(KIND)
    prompts = render_prompts(lm.tokenizer)[:1]
    eng = _engine(lm, tmp_path)
    with caplog.at_level(logging.INFO, logger="hacrl_fed.worker"):
        eng.generate(prompts, 1, Sampling(max_new_tokens=3), seed=0)
        eng.prepare_update()
        _update(lm.model)
        eng.weights_updated()
        eng.generate(prompts, 1, Sampling(max_new_tokens=3), seed=0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("vllm engine:")]
    synced = [ln for ln in lines if "synced" in ln]
    assert [ln.split(" synced")[0] for ln in synced] == ["vllm engine: weights version 1",
                                                          "vllm engine: weights version 2"], lines
    assert all("every parameter loaded" in ln for ln in synced)
    used = [ln for ln in lines if "generating" in ln]
    assert ["with weights version 1 (every vLLM worker holds version [1]" in used[0],
            "with weights version 2 (every vLLM worker holds version [2]" in used[1]] == [True, True], used


def test_a_sync_whose_names_vllm_does_not_know_is_an_error(load_tiny, render_prompts, tmp_path, monkeypatch):
    lm = load_tiny(KIND)
    eng = _engine(lm, tmp_path)
    from hacrl_fed.rollout import vllm_engine

    real = vllm_engine.hf_weights
    monkeypatch.setattr(vllm_engine, "hf_weights", lambda m: [(f"base_model.model.{n}", t) for n, t in real(m)])
    with pytest.raises(WeightSyncError, match="did not load"):
        eng.generate(render_prompts(lm.tokenizer)[:1], 1, Sampling(max_new_tokens=3), seed=0)


def test_a_sync_that_writes_nothing_is_an_error(load_tiny, render_prompts, tmp_path):
    lm = load_tiny(KIND)
    eng = _engine(lm, tmp_path)
    eng.llm.model.lose_writes = True
    _update(lm.model)                       # the training model differs from what vLLM loaded at start
    with pytest.raises(WeightSyncError, match="did not write what was sent"):
        eng.generate(render_prompts(lm.tokenizer)[:1], 1, Sampling(max_new_tokens=3), seed=0)


def test_weights_that_changed_without_a_sync_are_caught_before_generating(load_tiny, render_prompts, tmp_path):
    lm = load_tiny(KIND)
    prompts = render_prompts(lm.tokenizer)[:1]
    eng = _engine(lm, tmp_path)
    eng.generate(prompts, 1, Sampling(max_new_tokens=3), seed=0)
    eng.synced = eng.version = eng.version + 1          # bookkeeping says synced, vLLM's stamp says otherwise
    calls = len(eng.llm.calls)
    with pytest.raises(WeightSyncError, match="version"):
        eng.generate(prompts, 1, Sampling(max_new_tokens=3), seed=0)
    assert len(eng.llm.calls) == calls, "nothing was generated with stale weights"


def test_sleep_mode_frees_the_engine_for_the_update_and_wakes_weights_before_kv_cache(load_tiny, render_prompts,
                                                                                     tmp_path):
    lm = load_tiny(KIND)
    prompts = render_prompts(lm.tokenizer)[:1]
    eng = _engine(lm, tmp_path, settings=VLLMSettings(dtype="float32", enable_sleep_mode=True))
    eng.generate(prompts, 1, Sampling(max_new_tokens=3), seed=0)
    eng.llm.events.clear()
    eng.prepare_update()
    _update(lm.model)
    eng.weights_updated()
    eng.generate(prompts, 1, Sampling(max_new_tokens=3), seed=0)
    kinds = [e[:2] if e[0] != "rpc" else e for e in eng.llm.events]
    assert kinds == [("sleep", 2), ("wake_up", ("weights",)), ("rpc", "load_weights_on_worker"),
                     ("reset_prefix_cache",), ("wake_up", ("kv_cache",)), ("rpc", "weights_version_on_worker"),
                     ("generate", None)]
    plain = _engine(lm, tmp_path / "b")
    plain.prepare_update()
    assert not any(e[0] == "sleep" for e in plain.llm.events)


def test_lora_adapters_are_loaded_as_adapters_one_version_at_a_time(load_tiny, render_prompts, tmp_path):
    from safetensors.torch import load_file

    lm = load_tiny(KIND, lora_rank=4)
    prompts = render_prompts(lm.tokenizer)[:1]
    eng = _engine(lm, tmp_path, settings=VLLMSettings(dtype="float32", lora_rank=4))
    assert eng.settings.max_lora_rank == 8
    eng.generate(prompts, 1, Sampling(max_new_tokens=3), seed=0)
    eng.llm.events.clear()
    eng.prepare_update()
    assert eng.llm.events == [], "no sleep without sleep mode"
    assert eng.llm.calls[-1]["lora_request"].lora_int_id == 1
    first = tmp_path / "vllm" / "lora-v00000001"
    assert (first / "adapter_config.json").is_file()
    eng.prepare_update()
    _update(lm.model)
    eng.weights_updated()
    eng.generate(prompts, 1, Sampling(max_new_tokens=3), seed=0)
    req = eng.llm.calls[-1]["lora_request"]
    assert req.lora_int_id == 2 and eng.llm.llm_engine.list_loras() == {2} and not first.exists()
    saved = load_file(str(tmp_path / "vllm" / "lora-v00000002" / "adapter_model.safetensors"))
    live = {n: p for n, p in lm.model.named_parameters() if "lora_" in n}
    assert saved and all(any(torch.equal(t, p.detach()) for p in live.values()) for t in saved.values())
    assert eng.llm.model.loads == 0, "base weights are never re-sent for LoRA"
    eng.llm.llm_engine.accept = False
    eng.weights_updated()
    with pytest.raises(WeightSyncError, match="refused"):
        eng.generate(prompts, 1, Sampling(max_new_tokens=3), seed=0)


def test_a_lora_site_sleeps_at_level_1_keeping_its_base_weights(load_tiny, render_prompts, tmp_path):
    lm = load_tiny(KIND, lora_rank=4)
    eng = _engine(lm, tmp_path, settings=VLLMSettings(dtype="float32", lora_rank=4, enable_sleep_mode=True))
    eng.generate(render_prompts(lm.tokenizer)[:1], 1, Sampling(max_new_tokens=3), seed=0)
    eng.prepare_update()
    assert eng.llm.events[-1] == ("sleep", 1)


def test_a_prefix_cache_that_cannot_be_reset_fails_the_sync(load_tiny, render_prompts, tmp_path):
    lm = load_tiny(KIND)
    eng = _engine(lm, tmp_path)
    eng.llm.reset_prefix_cache = lambda: False
    with pytest.raises(WeightSyncError, match="prefix cache"):
        eng.generate(render_prompts(lm.tokenizer)[:1], 1, Sampling(max_new_tokens=3), seed=0)


# ----------------------------------------------------------------------------------- choosing the engine


def test_the_hf_engine_is_the_default_and_vllm_is_imported_only_when_asked(load_tiny, tmp_path):
    from hacrl_fed.config import ModelConfig

    lm = load_tiny(KIND)
    eng = build_engine(lm, ModelConfig(name_or_path=KIND), work_dir=tmp_path)
    assert isinstance(eng, HFRolloutEngine) and eng.name == "hf"
    if vllm_available():
        pytest.skip("vllm is installed here")
    cfg = ModelConfig.model_construct(**(ModelConfig(name_or_path=KIND).model_dump() | {"engine": "vllm"}))
    with pytest.raises(VLLMUnavailableError, match="not installed in this environment"):
        build_engine(lm, cfg, work_dir=tmp_path)
    assert not (tmp_path / "vllm-model").exists(), "nothing is exported before vllm is found"


def test_vllm_on_a_cpu_device_is_a_config_error():
    from pydantic import ValidationError

    from hacrl_fed.config import ModelConfig

    with pytest.raises(ValidationError, match="needs a CUDA device"):
        ModelConfig(name_or_path=KIND, engine="vllm")
    with pytest.raises(ValidationError, match="CUDA_VISIBLE_DEVICES=1 and device = 'cuda'"):
        ModelConfig(name_or_path=KIND, engine="vllm", device="cuda:1")
    cfg = ModelConfig(name_or_path=KIND, engine="vllm", device="cuda", gpu_memory_utilization=0.5)
    assert (cfg.engine, cfg.enable_sleep_mode, cfg.tensor_parallel_size) == ("vllm", False, 1)
    assert [VLLMSettings.for_model_dtype(d) for d in ("float32", "bfloat16", "float16")] == [
        "bfloat16", "bfloat16", "float16"]


def test_vllm_on_a_cpu_is_accepted_where_the_environment_says_vllm_is_a_cpu_build(monkeypatch):
    from pydantic import ValidationError

    from hacrl_fed.config import VLLM_CPU_ENV, ModelConfig, vllm_devices

    monkeypatch.delenv(VLLM_CPU_ENV, raising=False)
    with pytest.raises(ValidationError, match=f"set {VLLM_CPU_ENV}=1"):
        ModelConfig(name_or_path=KIND, engine="vllm", device="cpu")
    monkeypatch.setenv(VLLM_CPU_ENV, "1")
    assert "cpu" in vllm_devices()
    assert ModelConfig(name_or_path=KIND, engine="vllm", device="cpu").device == "cpu"
    with pytest.raises(ValidationError, match="CUDA_VISIBLE_DEVICES=1"):
        ModelConfig(name_or_path=KIND, engine="vllm", device="cuda:1")


def test_enforce_eager_comes_from_the_environment(monkeypatch):
    from hacrl_fed.rollout.vllm_engine import ENFORCE_EAGER_ENV

    monkeypatch.delenv(ENFORCE_EAGER_ENV, raising=False)
    assert "enforce_eager" not in VLLMSettings().llm_kwargs("/m")
    monkeypatch.setenv(ENFORCE_EAGER_ENV, "1")
    assert VLLMSettings().llm_kwargs("/m")["enforce_eager"] is True


def test_settings_become_vllms_llm_keywords():
    kw = VLLMSettings(gpu_memory_utilization=0.4, enable_sleep_mode=True, tensor_parallel_size=2, dtype="bfloat16",
                      max_model_len=768, lora_rank=12, seed=3).llm_kwargs("/m")
    assert kw == {"model": "/m", "tokenizer": "/m", "dtype": "bfloat16", "gpu_memory_utilization": 0.4,
                  "enable_sleep_mode": True, "tensor_parallel_size": 2, "seed": 3,
                  "logprobs_mode": "processed_logprobs", "generation_config": "vllm", "trust_remote_code": False,
                  "max_model_len": 768,
                  "enable_lora": True, "max_lora_rank": 16, "max_loras": 1}
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        VLLMSettings(gpu_memory_utilization=1.5)


# ----------------------------------------------------------------------------------- real vLLM (GPU)


@pytest.mark.gpu
def test_real_vllm_generates_and_follows_an_update(load_tiny, render_prompts, tmp_path):
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from hacrl_fed.config import ModelConfig
    from hacrl_fed.worker.models import load_model

    lm = load_model(ModelConfig(name_or_path=KIND, device="cuda", cache_dir=str(tmp_path / "cache")))
    cfg = ModelConfig(name_or_path=KIND, device="cuda", engine="vllm", behaviour_logprobs="generation",
                      gpu_memory_utilization=0.2)
    eng = build_engine(lm, cfg, work_dir=tmp_path / "vllm", max_model_len=512)
    prompts = render_prompts(lm.tokenizer)
    out = eng.generate(prompts, 2, Sampling(max_new_tokens=8), seed=0)
    want = eng.score([s.prompt_ids for s in out], [s.response_ids for s in out])
    for s, (total, _, _) in zip(out, want):
        assert abs(s.logprob_sum - total) < 1e-2 * max(1, s.token_count)
    eng.prepare_update()
    with torch.no_grad():
        for p in lm.model.parameters():
            p.mul_(0.5)
    eng.weights_updated()
    eng.generate(prompts, 1, Sampling(max_new_tokens=4), seed=0)       # the checksum check passes on real vLLM
    assert eng.sync_count == 2


# ----------------------------------------------------------------------------------- the --engine option


def _one_error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.skipif(vllm_available(), reason="vllm is installed here")
@pytest.mark.parametrize("command", ["eval", "worker", "client"])
def test_asking_for_vllm_where_it_is_not_importable_is_one_line_and_exit_2(command, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from hacrl_fed.cli import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"id": "a", "problem": "1+1?", "answer": "2"}\n')
    (tmp_path / "c.toml").write_text('[agent]\nname = "alice"\n[agent.model]\nname_or_path = "tiny-llama-bpe"\n'
                                     'device = "cuda"\n')
    args = {"eval": ["eval", "--model", "tiny-llama-bpe", "--data", "p.jsonl", "--engine", "vllm", "--device", "cuda"],
            "worker": ["worker", "--config", "c.toml", "--engine", "vllm"],
            "client": ["client", "--config", "c.toml", "--engine", "vllm"]}[command]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "engine 'vllm' needs the vllm package, which is not installed" in _one_error_line(result)
    assert not (tmp_path / "runs").exists(), "nothing was started or written"


def test_an_unknown_engine_or_vllm_on_a_cpu_is_refused_in_the_flags_terms():
    from typer.testing import CliRunner

    from hacrl_fed.cli import app

    result = CliRunner().invoke(app, ["eval", "--model", "tiny-llama-bpe", "--data", "x.jsonl", "--engine", "tgi"])
    line = _one_error_line(result)
    assert result.exit_code == 2 and "--engine: unknown rollout engine 'tgi'; registered: " in line and "vllm" in line
    result = CliRunner().invoke(app, ["eval", "--model", "tiny-llama-bpe", "--data", "x.jsonl", "--engine", "vllm"])
    assert result.exit_code == 2 and "--engine vllm runs on a GPU: give --device cuda (got --device cpu" in (
        _one_error_line(result))


def test_an_attached_worker_must_run_the_configured_engine():
    from hacrl_fed.config import ClientConfig, ConfigError
    from hacrl_fed.launch.client_cmd import check_worker_health
    from hacrl_fed.v1 import worker_pb2 as wpb

    cfg = ClientConfig.model_validate({"agent": {"name": "alice", "model": {"name_or_path": KIND}}})
    check_worker_health(wpb.HealthResponse(agent_id="alice", engine="hf"), cfg, "127.0.0.1:9")
    check_worker_health(wpb.HealthResponse(agent_id="alice"), cfg, "127.0.0.1:9")   # an older worker: hf
    with pytest.raises(ConfigError, match="runs the 'vllm' engine, this site's configuration says 'hf'"):
        check_worker_health(wpb.HealthResponse(agent_id="alice", engine="vllm"), cfg, "127.0.0.1:9")
    with pytest.raises(ConfigError, match="is agent 'bob'"):
        check_worker_health(wpb.HealthResponse(agent_id="bob", engine="hf"), cfg, "127.0.0.1:9")


def test_the_worker_tells_its_engine_before_and_after_each_update(make_sites, plans):
    """The agent worker frees the engine before the trainer changes the weights and marks them changed after,
    also when the update fails half-way; Health reports the engine."""
    from hacrl_fed.v1 import worker_pb2 as wpb

    make_plan, make_table = plans
    sites = make_sites({"alice": KIND})
    alice = sites.start("alice")
    calls: list[str] = []
    eng = alice.engine
    real_generate = eng.generate
    eng.prepare_update = lambda: calls.append("prepare_update")
    eng.weights_updated = lambda: calls.append("weights_updated")
    eng.generate = lambda *a, **k: calls.append("generate") or real_generate(*a, **k)
    plan = make_plan(1, g=2)
    env = alice.generate(plan).envelope
    alice.train(wpb.TrainRequest(run_id="run-a", step=1, plan=plan, envelopes=[env], capabilities=make_table(plan, {})))
    assert calls == ["generate", "prepare_update", "weights_updated"]
    assert alice.health().engine == "hf"

    def broken(*a, **k):
        raise RuntimeError("out of memory")

    alice.trainer.train_step = broken
    plan2 = make_plan(2, g=2)
    env2 = alice.generate(plan2).envelope
    calls.clear()
    with pytest.raises(RuntimeError):
        alice.train(wpb.TrainRequest(run_id="run-a", step=2, plan=plan2, envelopes=[env2],
                                     capabilities=make_table(plan2, {})))
    assert calls == ["prepare_update", "weights_updated"]


def test_the_vllm_worker_requirements_are_the_projects_without_flwr():
    """``client/requirements-vllm-worker.txt`` must not drift from ``pyproject.toml``: every dependency but flwr,
    with the same bounds, plus vllm."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    lines = [line.strip() for line in (root / "client" / "requirements-vllm-worker.txt").read_text().splitlines()]
    listed = [line for line in lines if line and not line.startswith("#")]
    norm = lambda spec: spec.replace(" ", "")                                    # noqa: E731
    assert sorted(map(norm, listed)) == sorted([norm(d) for d in project if not d.startswith("flwr")]
                                               + ["vllm==0.28.0"])


# ----------------------------------------------------------------------------------- vLLM's own classes (no GPU)


def test_vllms_own_sampling_params_lora_request_and_outputs_take_what_the_engine_builds(load_tiny):
    """Where vllm is importable (a worker environment), its real classes — not the stand-ins — accept the keywords
    the engine passes, and a real ``CompletionOutput`` maps as the stand-in does. Needs no GPU."""
    vllm = pytest.importorskip("vllm")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.logprobs import Logprob as VLogprob
    from vllm.lora.request import LoRARequest as VLoRARequest
    from vllm.outputs import CompletionOutput as VCompletionOutput

    sp = Sampling(temperature=0.8, top_p=1.0, top_k=0, max_new_tokens=16)
    params = vllm.SamplingParams(**sampling_kwargs(sp, 4, 2**62 + 5, stop_strings=["\nQuestion:"], eos_ids=[2, 7],
                                                   logprobs=True))
    assert (params.n, params.max_tokens, params.logprobs, params.stop, params.stop_token_ids) == (
        4, 16, 0, ["\nQuestion:"], [2, 7])
    VLoRARequest(lora_name="policy-v3", lora_int_id=3, lora_path="/tmp/adapter")
    fields = set(EngineArgs.__dataclass_fields__)
    kw = VLLMSettings(lora_rank=8, max_model_len=512, enable_sleep_mode=True).llm_kwargs("/m")
    assert set(kw) <= fields, sorted(set(kw) - fields)
    lm = load_tiny(KIND)
    eos = _eos(lm)
    out = VCompletionOutput(index=0, text="", token_ids=[11, 12, eos], cumulative_logprob=-3.0,
                            logprobs=[{11: VLogprob(-1.0)}, {12: VLogprob(-1.5)}, {eos: VLogprob(-0.5)}],
                            finish_reason="stop", stop_reason=None)
    got = completion_response(out.token_ids, out.logprobs, out.finish_reason, out.stop_reason, tokenizer=lm.tokenizer,
                              eos_ids=[eos], stop_strings=(), max_new_tokens=8)
    assert got == ([11, 12, eos], "stop", [-1.0, -1.5, -0.5])
