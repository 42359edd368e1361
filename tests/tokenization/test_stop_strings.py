"""Stop strings: a response is cut before the first stop string and ends with EOS (finish reason ``stop``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hacrl_fed.data.prompts import PLAIN_STOP_STRINGS, stop_strings
from hacrl_fed.tokenization.retokenize import clean_response_text, cut_at_stop_strings

STOP = "\nQuestion:"


def _ids(tok, text):
    return list(tok(text, add_special_tokens=False).input_ids)


@pytest.mark.parametrize("kind", ["tiny-llama-bpe", "tiny-gemma-unigram"])
def test_cut_before_next_question(tokenizers, kind):
    tok = tokenizers[kind]
    eos = tok.eos_token_id
    ids = _ids(tok, "3 + 4 = 7, so the answer is \\boxed{7}.\nQuestion: Calculate 1 + 1.\nAnswer: 2")
    cut, finish = cut_at_stop_strings(tok, ids, "length", [STOP], eos)
    assert finish == "stop" and cut[-1] == eos and eos not in cut[:-1]
    assert cut[:-1] == ids[:len(cut) - 1], "the kept tokens are the generated ones, not a re-encoding"
    text = clean_response_text(tok, cut, eos_ids=[eos])
    assert STOP not in text
    assert "3 + 4 = 7, so the answer is \\boxed{7}.".startswith(text.rstrip("\n"))
    assert text.rstrip().endswith("\\boxed{7}.")


def test_first_of_several_stop_strings_wins_and_a_stop_before_eos_still_cuts(unigram):
    eos = unigram.eos_token_id
    ids = _ids(unigram, "alpha beta gamma delta") + [eos]
    cut, finish = cut_at_stop_strings(unigram, ids, "stop", ["delta", " beta"], eos)
    assert finish == "stop" and cut[-1] == eos
    assert clean_response_text(unigram, cut, eos_ids=[eos]) == "alpha"


def test_no_stop_string_leaves_the_response_alone(bpe):
    eos = bpe.eos_token_id
    ids = _ids(bpe, "the answer is 12")
    assert cut_at_stop_strings(bpe, ids, "length", [STOP], eos) == (ids, "length")
    assert cut_at_stop_strings(bpe, ids + [eos], "stop", [STOP, ""], eos) == (ids + [eos], "stop")
    assert cut_at_stop_strings(bpe, ids, "length", [], eos) == (ids, "length")


def test_stop_string_at_the_start_leaves_just_eos(bpe):
    eos = bpe.eos_token_id
    assert cut_at_stop_strings(bpe, _ids(bpe, "\nQuestion: more"), "length", [STOP], eos) == ([eos], "stop")


@settings(max_examples=60, deadline=None)
@given(head=st.text(alphabet="ab 1+=.\\{}\n", max_size=30), tail=st.text(alphabet="ab 1.\n", max_size=10))
def test_cut_text_is_a_prefix_without_the_stop_string(tokenizers, head, tail):
    for tok in tokenizers.values():
        eos = tok.eos_token_id
        full = _ids(tok, head + STOP + tail)
        cut, finish = cut_at_stop_strings(tok, full, "length", [STOP], eos)
        text = clean_response_text(tok, cut, eos_ids=[eos])
        decoded = clean_response_text(tok, full, eos_ids=[eos])
        assert finish == "stop" and cut[-1] == eos
        assert STOP not in text
        assert decoded[:decoded.find(STOP)].startswith(text)


def test_default_stop_strings_follow_the_template(bpe, unigram):
    assert stop_strings(unigram) == list(PLAIN_STOP_STRINGS) == [STOP]  # no chat template: plain
    assert stop_strings(bpe) == []  # chat template: its EOS ends the turn
    assert stop_strings(bpe, "plain") == [STOP]
    assert stop_strings(unigram, configured=[]) == []
    assert stop_strings(bpe, configured=["###", ""]) == ["###"]
    with pytest.raises(ValueError, match="template"):
        stop_strings(bpe, "jinja")
