from __future__ import annotations

import pytest

from hacrl_fed.tiny_models import TINY_KINDS, build_tiny_model


@pytest.fixture(scope="session")
def tokenizers(tmp_path_factory):
    """Tokenizers of both tiny kinds: byte-level BPE (pad == EOS, chat template) and Unigram (no template)."""
    from transformers import AutoTokenizer

    return {kind: AutoTokenizer.from_pretrained(build_tiny_model(kind, tmp_path_factory.mktemp(kind)))
            for kind in TINY_KINDS}


@pytest.fixture
def bpe(tokenizers):
    return tokenizers["tiny-llama-bpe"]


@pytest.fixture
def unigram(tokenizers):
    return tokenizers["tiny-gemma-unigram"]
