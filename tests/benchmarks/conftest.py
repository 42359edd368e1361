"""Shared fixtures of the benchmark smoke tests: a tiny model directory and a way to run a script as users do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A tiny Llama model with a byte-level BPE tokenizer and a chat template, as a Hugging Face directory (what
    :func:`model_cache.hf_dir` returns as it is)."""
    from hacrl_fed.tiny_models import build_tiny_model

    return build_tiny_model("tiny-llama-bpe", tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture
def bench():
    """``bench(script, *args, timeout=…) -> CompletedProcess``: ``python benchmarks/<script> args`` from the
    repository root, offline, output captured; fails the test with the script's stderr when it exits non-zero."""

    def _run(script: str, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
        proc = subprocess.run([sys.executable, str(BENCH / script), *map(str, args)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            pytest.fail(f"{script} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        return proc

    return _run

