"""A plain Hugging Face directory of a model name, exported once, so benchmark subprocesses load it in seconds.

Packaged aliases (``smollm2-135m-instruct``) are GGUF files that ``transformers`` dequantizes at every load
(≈ 30 s on 2 CPU cores). :func:`hf_dir` loads the model once with the project's own loader
(:func:`hacrl_fed.worker.models.load_model`, float32) and writes it with
:func:`hacrl_fed.checkpoints.store.export_hf` under ``<cache>/hf/<name>``; every later call returns that
directory, which both sides of a side-by-side benchmark load, so they start from the same tensors.
A name that already is a directory is returned as it is.
"""

from __future__ import annotations

from pathlib import Path


def hf_dir(name_or_path: str, cache_dir: str | Path | None = None) -> Path:
    """The Hugging Face directory for ``name_or_path`` (exported on first use). Raises ``ModelLoadError`` when
    the model cannot be loaded (e.g. the alias's package is not installed; the message says what to install)."""
    from hacrl_fed.config import ModelConfig
    from hacrl_fed.checkpoints.store import export_hf
    from hacrl_fed.worker.models import default_cache_dir, load_model

    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    out = (Path(cache_dir) if cache_dir else default_cache_dir()) / "hf" / name_or_path.replace("/", "--")
    if not (out / "config.json").is_file():
        lm = load_model(ModelConfig(name_or_path=name_or_path))
        export_hf(lm.model, lm.tokenizer, out)
    return out
