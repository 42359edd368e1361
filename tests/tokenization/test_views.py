"""Training views: EOS convention, truncation, trailing padding, metadata, re-tokenization between tiny models."""

from __future__ import annotations

import pytest
import torch

from hacrl_fed.tokenization import (TrainingRow, build_rows, clean_response_text, collate, drift_stats,
                                    foreign_row, own_row, split_generated)
from hacrl_fed.v1 import rollout_pb2 as pb

MATH_TEXTS = [
    "We need 12 + 30 = 42, so the answer is \\boxed{42}.",
    "Let $x^2 - 5x + 6 = 0$; then $x \\in \\{2, 3\\}$ and $\\frac{1}{2} \\cdot 3.5 = 1.75$.",
    "π = 3.14159 and √2 ≤ 1.5 — “close” × 2 ÷ 4 😀 中文",
    "Total:  7 marbles  (double spaces kept) #### 7",
    "1,000,000 - 999,999 = 1",
]


def make_rollout(text, finish=pb.STOP, *, prompt_id="p0", sample_index=0, reward=1.0, count=9, lp=-4.5):
    return pb.Rollout(prompt_id=prompt_id, sample_index=sample_index, response_text=text, reward=reward,
                      verdict=pb.CORRECT, behaviour_logprob_sum=lp, behaviour_token_count=count, finish_reason=finish)


@pytest.mark.parametrize("src_kind,dst_kind", [("tiny-llama-bpe", "tiny-gemma-unigram"),
                                               ("tiny-gemma-unigram", "tiny-llama-bpe")])
@pytest.mark.parametrize("text", MATH_TEXTS)
def test_cross_tokenization_preserves_text(tokenizers, src_kind, dst_kind, text):
    """Source ids -> published text -> learner ids decode back to the same text; EOS only at the end."""
    src, dst = tokenizers[src_kind], tokenizers[dst_kind]
    generated = src(text, add_special_tokens=False).input_ids + [src.eos_token_id]
    shared = clean_response_text(src, generated)
    assert shared == text
    row = foreign_row(dst, [7, 8], make_rollout(shared, count=len(generated)), "src", max_response_tokens=4096)
    assert row.response_ids[-1] == dst.eos_token_id and not row.truncated
    assert dst.eos_token_id not in row.response_ids[:-1]
    assert dst.decode(row.response_ids[:-1], clean_up_tokenization_spaces=False) == text
    assert row.behaviour_token_count == len(generated) and row.learner_token_count == len(row.response_ids)


def test_foreign_row_metadata_and_eos(unigram):
    text = MATH_TEXTS[0]
    row = foreign_row(unigram, (1, 2, 3), make_rollout(text, prompt_id="q7", sample_index=3, reward=0.0, count=11,
                                                       lp=-6.25), "alice", 4096, reward=1.0)
    body = unigram(text, add_special_tokens=False).input_ids
    assert row == TrainingRow(prompt_id="q7", sample_index=3, source_agent="alice", is_own=False, prompt_ids=(1, 2, 3),
                              response_ids=(*body, unigram.eos_token_id), reward=1.0, behaviour_logprob_sum=-6.25,
                              behaviour_token_count=11, learner_token_count=len(body) + 1, truncated=False,
                              finish_reason="stop", content_bytes=len(text.lstrip().encode("utf-8")))
    assert row.token_ratio == pytest.approx((len(body) + 1) / 11)


def test_length_finish_has_no_eos(unigram):
    row = foreign_row(unigram, (), make_rollout(MATH_TEXTS[1], pb.LENGTH), "a", 4096)
    assert row.response_ids == tuple(unigram(MATH_TEXTS[1], add_special_tokens=False).input_ids)
    assert row.finish_reason == "length" and not row.truncated


def test_truncation_removes_eos(unigram):
    body = unigram(MATH_TEXTS[0], add_special_tokens=False).input_ids
    cut = foreign_row(unigram, (), make_rollout(MATH_TEXTS[0]), "a", max_response_tokens=5)
    assert cut.response_ids == tuple(body[:5]) and cut.truncated and cut.learner_token_count == 5
    exact = foreign_row(unigram, (), make_rollout(MATH_TEXTS[0]), "a", max_response_tokens=len(body))
    assert exact.response_ids == tuple(body) and exact.truncated  # the EOS did not fit
    fits = foreign_row(unigram, (), make_rollout(MATH_TEXTS[0]), "a", max_response_tokens=len(body) + 1)
    assert fits.response_ids[-1] == unigram.eos_token_id and not fits.truncated


def test_empty_stopped_response_is_just_eos(bpe):
    row = foreign_row(bpe, (), make_rollout(""), "a", 16)
    assert row.response_ids == (bpe.eos_token_id,)


def test_literal_special_token_text_is_not_a_control_token(bpe):
    text = "x <|im_end|> y <|im_start|>assistant"
    row = foreign_row(bpe, (), make_rollout(text), "a", 4096)
    specials = set(bpe.all_special_ids) | {bpe.convert_tokens_to_ids("<|im_start|>")}
    assert not specials & set(row.response_ids[:-1])
    assert bpe.decode(row.response_ids[:-1]) == text


def test_bad_finish_reason(unigram):
    with pytest.raises(ValueError, match="finish reason"):
        foreign_row(unigram, (), make_rollout("1", pb.FINISH_REASON_UNSPECIFIED), "a", 16)
    with pytest.raises(ValueError, match="finish reason"):
        own_row(prompt_id="p", sample_index=0, agent="a", prompt_ids=(), response_ids=(1,), reward=0,
                behaviour_logprob_sum=0, finish_reason="eos", max_response_tokens=4)


def test_own_row_keeps_generated_ids(bpe):
    eos = bpe.eos_token_id
    ids = [5, 6, eos, 7, eos]  # pad == EOS: an inner EOS-valued id is kept, ids are taken as generated
    row = own_row(prompt_id="p", sample_index=1, agent="me", prompt_ids=[1, 2], response_ids=ids, reward=1,
                  behaviour_logprob_sum=-2.0, finish_reason="stop", max_response_tokens=8)
    assert row.response_ids == tuple(ids) and row.is_own and row.source_agent == "me"
    assert row.behaviour_token_count == row.learner_token_count == 5 and not row.truncated
    per_token = [-0.1, -0.2, -0.3, -0.4, -1.0]
    short = own_row(prompt_id="p", sample_index=1, agent="me", prompt_ids=[1, 2], response_ids=ids, reward=1,
                    behaviour_logprob_sum=-2.0, finish_reason=pb.STOP, max_response_tokens=3,
                    behaviour_token_logprobs=per_token)
    assert short.response_ids == (5, 6, eos) and short.truncated and not short.ends_with_eos
    # both sums and both lengths cover the kept tokens only (the ratio of an unchanged policy is exactly 1)
    assert short.behaviour_token_count == short.learner_token_count == 3
    assert short.behaviour_logprob_sum == pytest.approx(-0.6)
    with pytest.raises(ValueError, match="per-token behaviour log-probs"):
        own_row(prompt_id="p", sample_index=1, agent="me", prompt_ids=[1, 2], response_ids=ids, reward=1,
                behaviour_logprob_sum=-2.0, finish_reason=pb.STOP, max_response_tokens=3)


def test_split_generated_cuts_at_first_eos_and_keeps_inner_pad():
    eos, pad = 2, 0
    assert split_generated([5, pad, 6, eos, pad, pad], {eos}, 6) == ([5, pad, 6, eos], "stop")
    assert split_generated([5, eos, eos, eos], {eos}, 4) == ([5, eos], "stop")  # pad == EOS
    assert split_generated([5, 6, 7], {eos}, 3) == ([5, 6, 7], "length")


def test_clean_response_text_strips_specials(bpe):
    body = bpe("x = 4", add_special_tokens=False).input_ids
    start = bpe.convert_tokens_to_ids("<|im_start|>")
    assert clean_response_text(bpe, [start, *body, bpe.eos_token_id]) == "x = 4"
    assert clean_response_text(bpe, body) == "x = 4"


def test_collate_trailing_padding_pad_equals_eos(bpe):
    eos = pad = bpe.eos_token_id
    rows = [own_row(prompt_id="p", sample_index=0, agent="me", prompt_ids=[1, 2, 3], response_ids=[9, eos],
                    reward=1, behaviour_logprob_sum=0, finish_reason="stop", max_response_tokens=8),
            foreign_row(bpe, [1, 2], make_rollout("12 + 30 = 42"), "peer", 8)]
    batch = collate(rows, pad)
    lens = [3 + 2, 2 + rows[1].learner_token_count]
    width = max(lens)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["response_mask"].shape == (2, width)
    assert all(t.dtype == torch.long for t in batch.values())
    assert batch["prompt_lens"].tolist() == [3, 2]
    assert batch["response_lens"].tolist() == [2, rows[1].learner_token_count]
    for b, row in enumerate(rows):
        n = lens[b]
        assert batch["input_ids"][b, :n].tolist() == [*row.prompt_ids, *row.response_ids]
        assert (batch["input_ids"][b, n:] == pad).all()
        assert batch["attention_mask"][b].tolist() == [1] * n + [0] * (width - n)
        resp = batch["response_mask"][b].tolist()
        assert resp == [0] * len(row.prompt_ids) + [1] * len(row.response_ids) + [0] * (width - n)
        assert batch["response_mask"][b, n - 1] == 1 and batch["input_ids"][b, n - 1] == eos  # EOS stays in


def test_collate_keeps_inner_pad_tokens(unigram):
    pad = unigram.pad_token_id
    row = own_row(prompt_id="p", sample_index=0, agent="me", prompt_ids=[2], response_ids=[9, pad, 9, pad],
                  reward=0, behaviour_logprob_sum=0, finish_reason="length", max_response_tokens=8)
    batch = collate([row, foreign_row(unigram, [2, 3, 4], make_rollout("1 2 3 4 5 6 7"), "peer", 64)], pad)
    assert batch["response_mask"][0].sum() == 4 and batch["attention_mask"][0].sum() == 5
    with pytest.raises(ValueError):
        collate([], pad)


def test_build_rows_order_rewards_and_unknown_prompt(unigram):
    own = [own_row(prompt_id="p0", sample_index=0, agent="me", prompt_ids=[1], response_ids=[5], reward=0,
                   behaviour_logprob_sum=0, finish_reason="length", max_response_tokens=8)]
    foreign = {"zed": [make_rollout("1", prompt_id="p1")],
               "bob": [make_rollout("2", prompt_id="p0", sample_index=1), make_rollout("3", prompt_id="p1")]}
    prompts = {"p0": [1, 1], "p1": [2, 2, 2]}
    rows = build_rows(unigram, prompts, own, foreign, 16, rewards={("bob", "p1", 0): 0.0})
    assert [(r.source_agent, r.prompt_id) for r in rows] == [("me", "p0"), ("bob", "p0"), ("bob", "p1"), ("zed", "p1")]
    assert [r.reward for r in rows] == [0.0, 1.0, 0.0, 1.0]
    assert rows[2].prompt_ids == (2, 2, 2)
    with pytest.raises(ValueError, match="unknown prompt id"):
        build_rows(unigram, {"p0": [1]}, [], foreign, 16)


def _row(agent, lj, lk, *, own=False, truncated=False):
    return TrainingRow(prompt_id="p", sample_index=0, source_agent=agent, is_own=own, prompt_ids=(), response_ids=(0,) * lk,
                       reward=0.0, behaviour_logprob_sum=0.0, behaviour_token_count=lj, learner_token_count=lk,
                       truncated=truncated, finish_reason="stop")


def test_drift_stats():
    stats = drift_stats([_row("me", 5, 5, own=True), _row("a", 10, 12), _row("a", 4, 2, truncated=True),
                         _row("b", 8, 8), _row("b", 0, 1)])
    assert stats["src/a/token_ratio_mean"] == pytest.approx(0.85)
    assert stats["src/a/token_ratio_min"] == pytest.approx(0.5) and stats["src/a/token_ratio_max"] == pytest.approx(1.2)
    assert stats["src/a/truncated_frac"] == 0.5 and stats["src/b/truncated_frac"] == 0.0
    assert stats["src/b/token_ratio_mean"] == 1.0 and stats["src/b/rows"] == 2.0
    assert stats["retok/token_ratio_mean"] == pytest.approx((1.2 + 0.5 + 1.0) / 3)
    assert stats["retok/rows"] == 4.0 and "src/me/rows" not in stats
    assert drift_stats([_row("me", 5, 5, own=True)]) == {}


@pytest.mark.parametrize("shared", ["4 + 8 = 12", " 4 + 8 = 12", "  \n4 + 8 = 12"])
def test_foreign_text_follows_the_learner_templates_boundary(unigram, shared):
    """A plain template (``…Answer:``) gets one separating space, a chat template none; the shared text's
    own leading whitespace (an artifact of the source's template) never reaches the learner view."""
    plain = foreign_row(unigram, (1,), make_rollout(shared), "src", 4096, separator=" ")
    chat = foreign_row(unigram, (1,), make_rollout(shared), "src", 4096, separator="")
    assert plain.response_ids[:-1] == tuple(unigram(" 4 + 8 = 12", add_special_tokens=False).input_ids)
    assert chat.response_ids[:-1] == tuple(unigram("4 + 8 = 12", add_special_tokens=False).input_ids)
    assert plain.content_bytes == chat.content_bytes == len("4 + 8 = 12")
    as_shared = foreign_row(unigram, (1,), make_rollout(shared), "src", 4096)
    assert as_shared.response_ids[:-1] == tuple(unigram(shared, add_special_tokens=False).input_ids)


def test_response_separator_by_template(bpe, unigram):
    from hacrl_fed.data.prompts import response_separator

    assert response_separator(unigram, "plain") == " " and response_separator(bpe, "plain") == " "
    for tok in (bpe, unigram):
        expected = "" if getattr(tok, "chat_template", None) else " "
        assert response_separator(tok, "auto") == expected
    with pytest.raises(ValueError):
        response_separator(bpe, "chatml")


def test_source_eos_logprob_is_read_only_for_stop_rows(unigram):
    stop = make_rollout("x = 1", lp=-4.5, count=4)
    stop.behaviour_eos_logprob = -2.0
    row = foreign_row(unigram, (1,), stop, "src", 4096)
    assert row.behaviour_eos_logprob == -2.0 and row.ratio_excludes_eos
    assert row.ratio_source == (-2.5, 3) and row.ratio_learner_tokens == row.learner_token_count - 1
    length = make_rollout("x = 1", pb.LENGTH)
    assert foreign_row(unigram, (1,), length, "src", 4096).behaviour_eos_logprob is None
    cut = foreign_row(unigram, (1,), stop, "src", 2)                  # truncated: no EOS in the view
    assert cut.truncated and not cut.ratio_excludes_eos
