"""Query embeddings for the ``knn`` router: cosine similarity between a query and the calibration queries.

Two embedders (``route eval --embedder``):

* ``tfidf`` (default): scikit-learn's ``TfidfVectorizer`` over character 2–4-grams within word boundaries,
  fitted on the calibration queries, rows L2-normalised. No weights to download (this matters where no model
  hub is reachable) and it separates what decides which model is better on procedural and templated tasks: the
  task's wording, the operators, the number of terms and digits.
* a local directory of a Hugging Face model (any ``AutoModel``, e.g. a sentence-embedding model or one of the
  routed models themselves): the attention-masked mean of the last hidden state, L2-normalised. Semantic
  similarity where the wording differs; costs one forward pass per query.

Both return float32 arrays of shape (N, D) with unit rows (an all-zero row stays zero: similarity 0 to all).
:meth:`Embedder.matrix` gives the same rows without densifying the TF-IDF ones (a SciPy CSR matrix): D is the
number of distinct character n-grams, so the dense (N, D) array of a large calibration set can be gigabytes
(``route serve`` keeps its calibration embeddings sparse; :func:`cosine` takes either).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Embedder", "cosine", "load_embedder"]

MAX_QUERY_CHARS = 8192
"""Characters of a query the embedder reads (the head; longer text adds nothing a router needs)."""


def cosine(a: Any, b: Any) -> np.ndarray:
    """Cosine similarity of unit rows: (N, D) × (C, D) → (N, C) float32; either side may be a SciPy sparse
    matrix (:meth:`Embedder.matrix`)."""
    from scipy import sparse

    if sparse.issparse(a) or sparse.issparse(b):
        out = a @ b.T
        return np.asarray(out.toarray() if sparse.issparse(out) else out, dtype=np.float32)
    return np.asarray(a, dtype=np.float32) @ np.asarray(b, dtype=np.float32).T


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.where(n > 0, n, 1.0)).astype(np.float32)


@dataclass
class Embedder:
    """Fit on calibration texts, then embed any text. ``kind``: ``tfidf`` or the model directory."""

    kind: str = "tfidf"
    batch_size: int = 16
    _state: Any = field(default=None, repr=False)

    def fit(self, texts: Sequence[str]) -> Embedder:
        """Fit the TF-IDF vocabulary on ``texts`` (a model embedder needs no fitting). Returns self."""
        texts = [t[:MAX_QUERY_CHARS] for t in texts]
        if self.kind == "tfidf":
            from sklearn.feature_extraction.text import TfidfVectorizer

            if not texts:
                raise ValueError("the tfidf embedder needs at least one calibration query")
            self._state = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), sublinear_tf=True,
                                          dtype=np.float32).fit(texts)
        elif self._state is None:
            self._state = _load_model(self.kind)
        return self

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(N, D) float32 unit rows. Raises ``RuntimeError`` before :meth:`fit`."""
        if self._state is None:
            raise RuntimeError("Embedder.embed before fit")
        texts = [t[:MAX_QUERY_CHARS] for t in texts]
        if self.kind == "tfidf":
            return _unit(self._state.transform(texts).toarray())
        return _unit(_model_embed(self._state, texts, self.batch_size))

    def matrix(self, texts: Sequence[str]) -> Any:
        """:meth:`embed`'s rows, as a float32 CSR matrix (N, D) for ``tfidf`` (never densified; its rows are
        already L2-normalised), as the dense array otherwise."""
        if self._state is None:
            raise RuntimeError("Embedder.matrix before fit")
        if self.kind == "tfidf":
            return self._state.transform([t[:MAX_QUERY_CHARS] for t in texts]).astype(np.float32).tocsr()
        return self.embed(texts)


def load_embedder(kind: str) -> Embedder:
    """``tfidf`` or an existing local model directory; raises ``ValueError`` (one line) for anything else."""
    from pathlib import Path

    if kind != "tfidf" and not Path(kind).expanduser().is_dir():
        raise ValueError(f"--embedder must be tfidf or a local model directory, got {kind!r}")
    return Embedder(kind=kind if kind == "tfidf" else str(Path(kind).expanduser()))


def _load_model(path: str) -> tuple[Any, Any]:
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModel.from_pretrained(path).eval()
    return tok, model


def _model_embed(state: tuple[Any, Any], texts: list[str], batch_size: int) -> np.ndarray:
    import torch

    tok, model = state
    out = []
    with torch.inference_mode():
        for i in range(0, len(texts), batch_size):
            enc = tok(texts[i:i + batch_size], return_tensors="pt", padding=True, truncation=True, max_length=512)
            hidden = model(**enc).last_hidden_state                           # (B, T, H)
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)       # (B, T, 1)
            out.append(((hidden * mask).sum(1) / mask.sum(1).clamp(min=1)).float().numpy())
    return np.concatenate(out) if out else np.zeros((0, 1), dtype=np.float32)
