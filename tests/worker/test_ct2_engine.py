"""The ``ct2`` rollout engine (CTranslate2): float32 (the default) greedy tokens equal the ``hf`` engine's, int8
samples carry the training model's teacher-forced behaviour log-probs, seeds reproduce, a weights update is converted
before the next generation without touching the training model, and its settings and installation are checked; the
``auto`` engine picks ``ct2`` where it can run and ``hf`` elsewhere."""

from __future__ import annotations

import sys

import pytest
import torch

from hacrl_fed.config import ModelConfig
from hacrl_fed.rollout.engine import HFRolloutEngine, Sampling
from hacrl_fed.worker.engines import build_engine, require_engine

KINDS = ["tiny-llama-bpe", "tiny-gemma-unigram"]


def _ct2(lm, tmp_path, *, stop=None, **options):
    """The ``ct2`` engine of a loaded tiny model, built through the registry's factory."""
    cfg = ModelConfig(name_or_path="tiny-llama-bpe", engine="ct2", engine_options={"threads": 1, **options})
    return build_engine(lm, cfg, stop_strings=stop or (), max_batch_sequences=5, work_dir=tmp_path / "engine")


def _own_greedy_logprobs(engine, prompts, max_new_tokens: int) -> list[list[float]]:
    """ctranslate2's own log-prob of each greedy token (``GenerationStepResult.log_prob``), per prompt."""
    own: list[list[float]] = [[] for _ in prompts]
    engine._generator.generate_batch([[engine._vocab[t] for t in p] for p in prompts], max_length=max_new_tokens,
                                     include_prompt_in_result=False, end_token=list(engine.eos_ids),
                                     return_end_token=True, sampling_topk=1, return_scores=True,
                                     callback=lambda step: own[step.batch_id].append(step.log_prob) and False)
    return own


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind", KINDS)
def test_float32_greedy_tokens_equal_the_hf_engine(extra_eos, load_tiny, render_prompts, tmp_path, kind):
    lm = load_tiny(kind)
    prompts = render_prompts(lm.tokenizer)
    extra_eos(lm, prompts)
    sp = Sampling(temperature=0, max_new_tokens=20)
    hf = HFRolloutEngine(lm.model, lm.tokenizer, max_batch_sequences=3).generate(prompts, 2, sp, seed=1)
    engine = _ct2(lm, tmp_path, compute_type="float32")
    ct2 = engine.generate(prompts, 2, sp, seed=1)
    assert engine.name == "ct2" and engine.settings.compute_type == "float32"
    assert {s.finish_reason for s in hf} == {"stop", "length"}, "test needs both finish reasons"
    assert [(s.prompt_index, s.sample_index, s.response_ids, s.finish_reason, s.text) for s in ct2] == \
           [(s.prompt_index, s.sample_index, s.response_ids, s.finish_reason, s.text) for s in hf]
    for a, b in zip(ct2, hf):
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=2e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_stop_strings_cut_as_the_hf_engine(load_tiny, stop_string_case, tmp_path, kind):
    lm = load_tiny(kind)
    prompts, sp, stop, hf = stop_string_case(lm)
    ct2 = _ct2(lm, tmp_path, stop=[stop], compute_type="float32").generate(prompts, 1, sp, seed=0)
    assert any(s.finish_reason == "stop" and stop not in s.text for s in ct2), "test needs a stop-string cut"
    assert [(s.response_ids, s.finish_reason) for s in ct2] == [(s.response_ids, s.finish_reason) for s in hf]


@pytest.mark.parametrize("kind", KINDS)
def test_int8_samples_are_valid_and_carry_the_training_models_teacher_forced_logprobs(extra_eos, load_tiny,
                                                                                      render_prompts, tmp_path, kind):
    lm = load_tiny(kind)
    prompts = render_prompts(lm.tokenizer)
    eos = extra_eos(lm, prompts)
    sp = Sampling(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=12)
    engine = _ct2(lm, tmp_path, compute_type="int8")
    samples = engine.generate(prompts, 3, sp, seed=2)
    assert engine.settings.compute_type == "int8"
    assert [(s.prompt_index, s.sample_index) for s in samples] == [(p, i) for p in range(4) for i in range(3)]
    for s in samples:
        assert s.prompt_ids == tuple(prompts[s.prompt_index]) and s.token_count == len(s.response_ids) > 0
        if s.finish_reason == "stop":
            assert s.response_ids[-1] in (lm.tokenizer.eos_token_id, eos)
        else:
            assert len(s.response_ids) == 12 and not set(s.response_ids) & {lm.tokenizer.eos_token_id, eos}
    forced = HFRolloutEngine(lm.model, lm.tokenizer, behaviour_logprobs="teacher_forced")
    scored = forced.score([s.prompt_ids for s in samples], [s.response_ids for s in samples], 0.7)
    for s, (total, count, per_token) in zip(samples, scored):
        assert count == s.token_count and s.token_logprobs == pytest.approx(per_token, abs=1e-5)
        assert s.logprob_sum == pytest.approx(total, abs=1e-4)


def test_the_default_compute_type_is_float32_and_keeps_the_hf_engines_greedy_tokens(load_tiny, render_prompts,
                                                                                    tmp_path):
    lm = load_tiny("tiny-llama-bpe")
    prompts = render_prompts(lm.tokenizer)
    sp = Sampling(temperature=0, max_new_tokens=16)
    engine = _ct2(lm, tmp_path)
    ct2 = engine.generate(prompts, 1, sp, seed=0)
    hf = HFRolloutEngine(lm.model, lm.tokenizer).generate(prompts, 1, sp, seed=0)
    assert engine.settings.compute_type == "float32"
    assert [s.response_ids for s in ct2] == [s.response_ids for s in hf]


def _auto(lm, tmp_path, **model):
    cfg = ModelConfig(name_or_path="tiny-llama-bpe", engine="auto", **model)
    return build_engine(lm, cfg, max_batch_sequences=5, work_dir=tmp_path / "auto")


def test_auto_picks_ct2_float32_where_ctranslate2_imports_on_the_cpu(load_tiny, render_prompts, tmp_path):
    from hacrl_fed.worker.engines import auto_choice, resolve_engine

    lm = load_tiny("tiny-gemma-unigram")
    prompts = render_prompts(lm.tokenizer)
    sp = Sampling(temperature=0, max_new_tokens=12)
    engine = _auto(lm, tmp_path)
    assert (engine.name, engine.settings.compute_type) == ("ct2", "float32")
    hf = HFRolloutEngine(lm.model, lm.tokenizer).generate(prompts, 1, sp, seed=0)
    assert [s.response_ids for s in engine.generate(prompts, 1, sp, seed=0)] == [s.response_ids for s in hf]
    assert (auto_choice("cpu"), resolve_engine("auto"), resolve_engine("loop")) == ("ct2", "ct2", "loop")
    assert auto_choice("cuda") == auto_choice("cpu", "generation") == "hf"    # ct2 runs on the CPU, teacher-forced


def test_auto_falls_back_to_hf_without_ctranslate2_or_for_a_model_it_cannot_convert(load_tiny, monkeypatch, tmp_path,
                                                                                     caplog):
    from ctranslate2.converters import transformers as converter

    from hacrl_fed.worker.engines import resolve_engine

    lm = load_tiny("tiny-llama-bpe")
    assert _auto(lm, tmp_path, behaviour_logprobs="generation").name == "hf"
    with monkeypatch.context() as m:
        m.setattr(converter, "_MODEL_LOADERS", {})                         # the converter knows no architecture
        with caplog.at_level("WARNING", logger="hacrl_fed.worker.engines"):
            assert _auto(lm, tmp_path).name == "hf"
        assert "engine auto: hf (model.engine = 'ct2': ctranslate2" in caplog.text
    monkeypatch.setitem(sys.modules, "ctranslate2", None)                   # import ctranslate2 -> ImportError
    assert resolve_engine("auto") == "hf"
    assert _auto(lm, tmp_path).name == "hf"


def test_greedy_logprobs_are_teacher_forced_at_temperature_one(load_tiny, render_prompts, tmp_path):
    lm = load_tiny("tiny-llama-bpe")
    prompts = render_prompts(lm.tokenizer)
    samples = _ct2(lm, tmp_path).generate(prompts, 1, Sampling(temperature=0, max_new_tokens=8), seed=0)
    scored = HFRolloutEngine(lm.model, lm.tokenizer).score(prompts, [s.response_ids for s in samples], 1.0)
    for s, (_, _, per_token) in zip(samples, scored):
        assert s.token_logprobs == pytest.approx(per_token, abs=1e-5)


def test_same_seed_same_samples_another_seed_other_samples(load_tiny, render_prompts, tmp_path):
    lm = load_tiny("tiny-llama-bpe")
    prompts = render_prompts(lm.tokenizer)
    engine = _ct2(lm, tmp_path)
    sp = Sampling(temperature=1.0, max_new_tokens=10)
    a = [s.response_ids for s in engine.generate(prompts, 2, sp, seed=7)]
    engine.generate(prompts, 1, Sampling(temperature=0.5, max_new_tokens=6), seed=99)   # the stream moves on between
    b = [s.response_ids for s in engine.generate(prompts, 2, sp, seed=7)]
    c = [s.response_ids for s in engine.generate(prompts, 2, sp, seed=8)]
    assert a == b
    assert a != c
    assert len(set(a)) > 1


def test_an_update_is_converted_before_the_next_generation_and_the_training_model_is_untouched(
        load_tiny, render_prompts, tmp_path):
    lm = load_tiny("tiny-llama-bpe")
    prompts = render_prompts(lm.tokenizer)
    sp = Sampling(temperature=0, max_new_tokens=10)
    engine = _ct2(lm, tmp_path, compute_type="float32")
    before = _state(lm.model)
    first = engine.generate(prompts, 1, sp, seed=0)
    after = _state(lm.model)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(hasattr(layer, "self_attn") and hasattr(layer, "mlp") for layer in lm.model.model.layers)
    assert (engine.version, engine.converted, len(engine.refresh_seconds)) == (1, 1, 1)
    engine.generate(prompts, 1, sp, seed=0)
    assert len(engine.refresh_seconds) == 1, "no update, no conversion"

    with torch.no_grad():                                          # the update: every matrix moves
        for p in lm.model.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.2)
    engine.prepare_update()
    engine.weights_updated()
    assert engine.converted == 1 and engine.version == 2
    second = engine.generate(prompts, 1, sp, seed=0)
    assert (engine.converted, len(engine.refresh_seconds)) == (2, 2)
    hf = HFRolloutEngine(lm.model, lm.tokenizer).generate(prompts, 1, sp, seed=0)
    assert [s.response_ids for s in second] == [s.response_ids for s in hf]
    assert [s.response_ids for s in second] != [s.response_ids for s in first]
    assert sorted(p.name for p in (tmp_path / "engine").iterdir()) == ["ct2-model-2"]   # old version and temps gone


def test_a_lora_model_is_converted_merged_and_stays_a_lora_model(load_tiny, render_prompts, tmp_path):
    lm = load_tiny("tiny-llama-bpe", lora_rank=4)
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(3))
    prompts = render_prompts(lm.tokenizer)
    sp = Sampling(temperature=0, max_new_tokens=10)
    before = _state(lm.model)
    ct2 = _ct2(lm, tmp_path, compute_type="float32").generate(prompts, 1, sp, seed=0)
    hf = HFRolloutEngine(lm.model, lm.tokenizer).generate(prompts, 1, sp, seed=0)
    assert [s.response_ids for s in ct2] == [s.response_ids for s in hf]
    after = _state(lm.model)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_bad_settings_are_clear_errors(load_tiny, tmp_path):
    lm = load_tiny("tiny-llama-bpe")
    with pytest.raises(ValueError, match=r"compute_type = 'float64' is not a compute type ctranslate2 supports on "
                                         r"this CPU; choose one of .*int8"):
        _ct2(lm, tmp_path, compute_type="float64")
    with pytest.raises(ValueError, match=r"unknown key\(s\) beam for engine 'ct2'"):
        _ct2(lm, tmp_path, beam=4)
    with pytest.raises(ValueError, match=r"threads must be an integer >= 1, got 0"):
        _ct2(lm, tmp_path, threads=0)
    cfg = ModelConfig(name_or_path="tiny-llama-bpe", engine="ct2", behaviour_logprobs="generation")
    with pytest.raises(ValueError, match=r"behaviour_logprobs must be 'auto' or 'teacher_forced'"):
        build_engine(lm, cfg, work_dir=tmp_path)


def test_an_architecture_the_converter_does_not_know_is_refused():
    from hacrl_fed.rollout.ct2_engine import CT2UnavailableError, CT2UnsupportedModelError, require_ct2

    class MambaConfig:
        pass

    with pytest.raises(CT2UnsupportedModelError, match=r"cannot convert a MambaConfig model \(it converts .*Llama"):
        require_ct2(MambaConfig())
    assert issubclass(CT2UnsupportedModelError, CT2UnavailableError) and issubclass(CT2UnavailableError, ImportError)
    assert issubclass(CT2UnsupportedModelError, ValueError)      # hacrl-fed eval reports it in one line


def test_check_installed_raises_import_error_without_ctranslate2(monkeypatch):
    from hacrl_fed.registries import ROLLOUT_ENGINES

    monkeypatch.setitem(sys.modules, "ctranslate2", None)               # import ctranslate2 -> ImportError
    with pytest.raises(ImportError, match=r"needs ctranslate2, which does not import here .*hacrl-fed\[fast\]") as err:
        ROLLOUT_ENGINES.get_callable("ct2").check_installed()
    assert "\n" not in str(err.value)
    with pytest.raises(ImportError, match="needs ctranslate2"):
        require_engine("ct2")


@pytest.mark.parametrize("window", [16, 256])
def test_a_gemma3_model_with_full_and_sliding_attention_layers_decodes_as_the_hf_engine(load_tiny, render_prompts,
                                                                                        tmp_path, window):
    """Both RoPE bases (other than the converter's defaults), the query scale and the sliding window reach the
    converted model (the tiny Gemma model has sliding layers only)."""
    from transformers import Gemma3ForCausalLM

    from hacrl_fed.rollout.ct2_engine import CT2RolloutEngine, CT2Settings

    tiny = load_tiny("tiny-gemma-unigram")
    rope = {"full_attention": {"rope_type": "default", "rope_theta": 5e4},
            "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}}
    cfg = type(tiny.model.config)(**{**tiny.model.config.to_dict(), "num_hidden_layers": 3, "sliding_window": window,
                                      "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                                      "rope_parameters": rope})
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    model.generation_config.eos_token_id = tiny.tokenizer.eos_token_id
    prompts = render_prompts(tiny.tokenizer)
    assert max(map(len, prompts)) > window or window > 64, "the window must cut the longest prompt"
    sp = Sampling(temperature=0, max_new_tokens=16)
    hf = HFRolloutEngine(model, tiny.tokenizer).generate(prompts, 1, sp, seed=0)
    engine = CT2RolloutEngine(model, tiny.tokenizer, work_dir=tmp_path, settings=CT2Settings("float32", 1))
    assert [s.response_ids for s in engine.generate(prompts, 1, sp, seed=0)] == [s.response_ids for s in hf]
    for s, own in zip(hf, _own_greedy_logprobs(engine, prompts, 16)):   # ctranslate2's log-probs of its tokens
        assert own == pytest.approx(s.token_logprobs, abs=1e-4)


def test_without_logprobs_the_teacher_forced_pass_is_skipped_and_the_tokens_are_the_same(load_tiny, render_prompts,
                                                                                        tmp_path, monkeypatch):
    """``Sampling.logprobs = False`` (evaluation): the same tokens, no re-scoring pass, Σ 0 and no per-token values."""
    import dataclasses

    lm = load_tiny("tiny-llama-bpe")
    prompts = render_prompts(lm.tokenizer)
    engine = _ct2(lm, tmp_path)
    sp = Sampling(temperature=0.7, max_new_tokens=12)
    with_lp = engine.generate(prompts, 2, sp, seed=3)
    monkeypatch.setattr(engine.scorer, "score", lambda *a, **k: pytest.fail("scored although no log-probs asked"))
    without = engine.generate(prompts, 2, dataclasses.replace(sp, logprobs=False), seed=3)
    assert [s.response_ids for s in without] == [s.response_ids for s in with_lp]
    assert all(s.token_logprobs == () and s.logprob_sum == 0.0 for s in without)
    assert all(len(s.token_logprobs) == s.token_count for s in with_lp)
