"""Fixtures of the algorithm tests: tiny models with incompatible tokenizers."""

from __future__ import annotations

import pytest
import torch
from algo_testkit import GEMMA, LLAMA

from hacrl_fed.tiny_models import build_tiny_model


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, str]:
    """Saved tiny model directories of both kinds (built once per session, ~1 s each)."""
    return {kind: str(build_tiny_model(kind, tmp_path_factory.mktemp(kind))) for kind in (LLAMA, GEMMA)}


@pytest.fixture
def load_tiny(tiny_dirs):
    """``load_tiny(kind) -> (model, tokenizer)``: a fresh float32 copy (eval mode, as loaded; the tiny models have no dropout)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def _load(kind: str):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_dirs[kind], dtype=torch.float32)
        return model, AutoTokenizer.from_pretrained(tiny_dirs[kind])

    return _load
