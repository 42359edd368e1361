"""Property: the learner's encoding of a shared text decodes back to the same text (hypothesis)."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hacrl_fed.tokenization import encode_response_text

MATH_CHARS = string.ascii_letters + string.digits + string.punctuation + " " + "πσθ√∑∫≤≥≠≈×÷±°²·—“”‘’ñéüß😀中文"
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _roundtrips(tok, text):
    return tok.decode(encode_response_text(tok, text), clean_up_tokenization_spaces=False) == text


@PROPERTY
@given(text=st.text(st.characters(exclude_categories=["Cs"]), max_size=80))
def test_byte_level_bpe_roundtrips_any_text(bpe, text):
    ids = encode_response_text(bpe, text)
    assert bpe.decode(ids, clean_up_tokenization_spaces=False) == text
    assert bpe.eos_token_id not in ids  # literal "<|im_end|>" cannot become the EOS


@pytest.fixture
def unigram_alphabet(unigram):
    """Characters the Unigram tokenizer represents on their own (no <unk>, unchanged by NFKC)."""
    chars = [c for c in MATH_CHARS if c == " " or _roundtrips(unigram, "a" + c)]
    assert len(chars) > 80  # letters, digits, punctuation, the unicode of its training corpus
    return "".join(chars)


@PROPERTY
@given(data=st.data())
def test_unigram_roundtrips_math_text(unigram, unigram_alphabet, data):
    # Metaspace drops one leading space on decode: shared texts are stripped on the left by the model anyway
    text = data.draw(st.text(st.sampled_from(unigram_alphabet), max_size=80).filter(lambda s: not s.startswith(" ")))
    assert _roundtrips(unigram, text)
