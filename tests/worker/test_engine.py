"""Rollout engine: batched = per-sample under greedy decoding, behaviour log-probs, EOS handling."""

from __future__ import annotations

import math

import pytest
import torch

from hacrl_fed.rollout.engine import HFRolloutEngine, Sampling

KINDS = ["tiny-llama-bpe", "tiny-gemma-unigram"]


def _naive_logprob_sum(model, prompt, response, temperature):
    """Σ log softmax(logits / T)[token] over the response, one full forward, no padding."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    pos = range(len(prompt), len(prompt) + len(response))
    return float(sum(logp[t - 1, ids[0, t]] for t in pos))


def _with_extra_eos(lm, prompts, engine_kw=None):
    """Declare a token the model greedily emits mid-response as an extra EOS id, so rows really stop."""
    eng = HFRolloutEngine(lm.model, lm.tokenizer, **(engine_kw or {}))
    probe = eng.generate(prompts, 1, Sampling(temperature=0, max_new_tokens=12), seed=0)
    token = probe[1].response_ids[5]
    lm.model.generation_config.eos_token_id = [lm.tokenizer.eos_token_id, token]
    return HFRolloutEngine(lm.model, lm.tokenizer, **(engine_kw or {})), token


@pytest.mark.parametrize("kind", KINDS)
def test_batched_equals_per_sample_greedy(load_tiny, render_prompts, kind):
    lm = load_tiny(kind)
    prompts = render_prompts(lm.tokenizer)
    eng, extra_eos = _with_extra_eos(lm, prompts, {"max_batch_sequences": 3})
    sp = Sampling(temperature=0, max_new_tokens=20)
    batched = eng.generate(prompts, 2, sp, seed=7)
    assert [(s.prompt_index, s.sample_index) for s in batched] == [(p, i) for p in range(4) for i in range(2)]
    assert {s.finish_reason for s in batched} == {"stop", "length"}, "test needs both finish reasons"
    for p, prompt in enumerate(prompts):
        single = eng.generate([prompt], 1, sp, seed=123)[0]
        for s in batched[2 * p:2 * p + 2]:
            assert s.response_ids == single.response_ids
            assert s.finish_reason == single.finish_reason
            assert s.text == single.text
            assert s.token_count == single.token_count == len(s.response_ids)
            assert s.logprob_sum == pytest.approx(single.logprob_sum, abs=1e-4)
    for s in batched:
        if s.finish_reason == "stop":
            assert s.response_ids[-1] == extra_eos and extra_eos not in s.response_ids[:-1]
        else:
            assert len(s.response_ids) == 20


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_behaviour_logprobs_match_naive_forward(load_tiny, render_prompts, kind, temperature):
    lm = load_tiny(kind)
    prompts = render_prompts(lm.tokenizer)
    eng, _ = _with_extra_eos(lm, prompts, {"logprob_batch_tokens": 64, "logprob_chunk_tokens": 5})
    samples = eng.generate(prompts, 2, Sampling(temperature=temperature, max_new_tokens=16), seed=3)
    t = 1.0 if temperature == 0 else temperature
    stops = [s for s in samples if s.finish_reason == "stop"]
    for s in samples:
        expected = _naive_logprob_sum(lm.model, s.prompt_ids, s.response_ids, t)
        assert s.logprob_sum == pytest.approx(expected, rel=1e-5, abs=1e-4)
        assert s.token_count == len(s.response_ids)
        assert math.isfinite(s.logprob_sum) and s.logprob_sum < 0
    if temperature == 0:
        assert stops, "greedy run must include a stopped row (terminal EOS counted)"


def test_sampling_is_seeded_and_leaves_global_rng_alone(load_tiny, render_prompts):
    lm = load_tiny("tiny-gemma-unigram")
    eng = HFRolloutEngine(lm.model, lm.tokenizer, max_batch_sequences=5)
    prompts = render_prompts(lm.tokenizer)
    sp = Sampling(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=10)
    torch.manual_seed(99)
    before = torch.get_rng_state()
    a = eng.generate(prompts, 3, sp, seed=11)
    assert torch.equal(torch.get_rng_state(), before)
    b = eng.generate(prompts, 3, sp, seed=11)
    c = eng.generate(prompts, 3, sp, seed=12)
    assert [s.response_ids for s in a] == [s.response_ids for s in b]
    assert [s.response_ids for s in a] != [s.response_ids for s in c]
    assert len({s.response_ids for s in a}) > 1


def test_sampling_validation_and_bad_input(load_tiny):
    lm = load_tiny("tiny-gemma-unigram")
    eng = HFRolloutEngine(lm.model, lm.tokenizer)
    for bad in [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-1), dict(max_new_tokens=0)]:
        with pytest.raises(ValueError):
            Sampling(**bad)
    with pytest.raises(ValueError, match="at least one token"):
        eng.generate([[]], 1, Sampling(), seed=0)
    with pytest.raises(ValueError, match="n must be"):
        eng.generate([[1, 2]], 0, Sampling(), seed=0)


@pytest.mark.parametrize("kind", KINDS)
def test_stop_strings_end_generation_and_cut_the_response(load_tiny, render_prompts, kind):
    lm = load_tiny(kind)
    prompts = render_prompts(lm.tokenizer)
    sp = Sampling(temperature=0, max_new_tokens=16)
    plain = HFRolloutEngine(lm.model, lm.tokenizer).generate(prompts, 1, sp, seed=0)
    stop = next(s.text[4:7] for s in plain if len(s.text) > 8 and s.text[4:7].strip())  # text the model really writes
    eng = HFRolloutEngine(lm.model, lm.tokenizer, stop_strings=[stop])
    cut = eng.generate(prompts, 1, sp, seed=0)
    assert any(stop in s.text for s in plain)
    for before, after in zip(plain, cut):
        if stop not in before.text:
            assert (after.response_ids, after.finish_reason) == (before.response_ids, before.finish_reason)
            continue
        assert after.finish_reason == "stop" and after.response_ids[-1] == eng.eos_ids[0]
        assert after.response_ids[:-1] == before.response_ids[:len(after.response_ids) - 1]
        assert stop not in after.text and before.text[:before.text.find(stop)].startswith(after.text)
        assert after.token_count == len(after.response_ids)
        assert after.logprob_sum == pytest.approx(
            _naive_logprob_sum(lm.model, after.prompt_ids, after.response_ids, 1.0), abs=1e-3)


def test_stop_criterion_marks_only_rows_whose_tail_holds_a_stop_string(load_tiny):
    from hacrl_fed.rollout.engine import _StopOnStrings

    tok = load_tiny("tiny-gemma-unigram").tokenizer
    rows = [tok("x y\nQuestion: z", add_special_tokens=False).input_ids, tok("x y z w", add_special_tokens=False).input_ids]
    width = max(map(len, rows))
    prompt = [5, 6]
    ids = torch.tensor([prompt + r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    done = _StopOnStrings(tok, ["\nQuestion:"], prompt_width=len(prompt))(ids, None)
    assert done.tolist() == [True, False]


@pytest.mark.parametrize("kind", KINDS)
def test_per_token_behaviour_logprobs_and_eos_logprob(load_tiny, render_prompts, kind):
    lm = load_tiny(kind)
    prompts = render_prompts(lm.tokenizer)
    eng, extra_eos = _with_extra_eos(lm, prompts)
    samples = eng.generate(prompts, 2, Sampling(temperature=0.7, max_new_tokens=20), seed=3)
    assert {s.finish_reason for s in samples} == {"stop", "length"}, "test needs both finish reasons"
    for s in samples:
        assert len(s.token_logprobs) == s.token_count == len(s.response_ids)
        assert sum(s.token_logprobs) == pytest.approx(s.logprob_sum, abs=1e-6)
        assert all(x <= 1e-6 for x in s.token_logprobs)
        if s.finish_reason == "stop":
            # the EOS term alone: Σ over the response minus Σ over the response without its EOS
            body = _naive_logprob_sum(lm.model, s.prompt_ids, s.response_ids[:-1], 0.7)
            assert s.eos_logprob == pytest.approx(s.logprob_sum - body, abs=1e-3)
        else:
            assert s.eos_logprob is None


@pytest.mark.parametrize("kind", KINDS)
def test_generation_pass_logprobs_equal_teacher_forced(load_tiny, render_prompts, kind):
    """Same samples, same per-token values from the sampling pass and from a second forward — with top-k /
    top-p truncation (which changes what is sampled, not the untruncated log-prob) and a stop-string cut
    (whose appended EOS was never sampled)."""
    lm = load_tiny(kind)
    prompts = render_prompts(lm.tokenizer)
    sp = Sampling(temperature=0.7, top_p=0.8, top_k=7, max_new_tokens=16)
    probe = HFRolloutEngine(lm.model, lm.tokenizer).generate(prompts, 2, sp, seed=4)
    stop = next(s.text[3:5] for s in probe if len(s.text) > 8 and s.text[3:5].strip())
    gen = HFRolloutEngine(lm.model, lm.tokenizer, stop_strings=[stop])
    forced = HFRolloutEngine(lm.model, lm.tokenizer, stop_strings=[stop], behaviour_logprobs="teacher_forced")
    a, b = gen.generate(prompts, 2, sp, seed=4), forced.generate(prompts, 2, sp, seed=4)
    assert any(stop in s.text for s in probe), "test needs a stop-string cut"
    assert [s.response_ids for s in a] == [s.response_ids for s in b]
    for x, y in zip(a, b):
        assert len(x.token_logprobs) == len(y.token_logprobs) == x.token_count
        assert x.token_logprobs == pytest.approx(y.token_logprobs, abs=2e-5)
        assert x.logprob_sum == pytest.approx(y.logprob_sum, abs=1e-4)
        assert x.eos_logprob == pytest.approx(y.eos_logprob, abs=2e-5) if y.eos_logprob is not None else x.eos_logprob is None


def test_row_logprobs_reads_prefixes_and_refuses_the_rest():
    from hacrl_fed.rollout.engine import _row_logprobs

    generated, sampled, eos = [5, 6, 7, 9], [-1.0, -2.0, -3.0, -4.0], [-10.0, -20.0, -30.0, -40.0]
    assert _row_logprobs(generated, [5, 6, 7], sampled, eos, eos_id=9) == (-1.0, -2.0, -3.0)
    assert _row_logprobs(generated, [5, 6, 9], sampled, eos, eos_id=9) == (-1.0, -2.0, -30.0)   # cut + EOS
    assert _row_logprobs(generated, [5, 8, 7], sampled, eos, eos_id=9) is None                  # not sampled


def test_engine_options_are_checked(load_tiny):
    lm = load_tiny("tiny-llama-bpe")
    assert HFRolloutEngine(lm.model, lm.tokenizer).behaviour_logprobs == "generation"            # float32: auto
    assert HFRolloutEngine(lm.model, lm.tokenizer, autocast_dtype=torch.bfloat16).behaviour_logprobs == "teacher_forced"
    with pytest.raises(ValueError, match="behaviour_logprobs must be one of auto, generation, teacher_forced"):
        HFRolloutEngine(lm.model, lm.tokenizer, behaviour_logprobs="vllm")
    with pytest.raises(ValueError, match="autocast dtype"):
        HFRolloutEngine(lm.model, lm.tokenizer, autocast_dtype=torch.float64)


def test_capture_keeps_one_step_of_logits():
    """The capture records [B] values per step and keeps a single [B, V] log-softmax, whatever the length."""
    from hacrl_fed.rollout.engine import _SampledTokenLogprobs

    B, V, width = 3, 50, 4
    cap = _SampledTokenLogprobs(temperature=0.5, eos_id=7, prompt_width=width)
    ids = torch.zeros((B, width), dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    steps = []
    for _ in range(5):
        scores = torch.randn((B, V), generator=g)
        assert cap(ids, scores) is scores                                   # logits pass through untouched
        steps.append(torch.log_softmax(scores / 0.5, -1))
        ids = torch.cat([ids, torch.randint(0, V, (B, 1), generator=g)], dim=1)
    sampled, eos = cap.result(ids[:, width:])
    want = torch.stack([s.gather(1, ids[:, width + t:width + t + 1]).squeeze(1) for t, s in enumerate(steps)], 1)
    torch.testing.assert_close(sampled, want)
    torch.testing.assert_close(eos, torch.stack([s[:, 7] for s in steps], 1))
    assert all(t.untyped_storage().nbytes() == B * 4 for t in cap._eos + cap._sampled)
    with pytest.raises(RuntimeError, match="out of step"):
        cap(ids[:, :2], torch.zeros((B, V)))
