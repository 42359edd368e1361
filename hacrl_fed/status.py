"""What a worker is doing, for a progress display: a small JSON status file, rewritten as the phase changes.

``hacrl-fed simulate`` starts each worker with ``--status-file <run dir>/<agent>/status.json`` and shows
one line per agent from it (:mod:`hacrl_fed.report.progress`). The file holds::

    {"agent": "gemma3", "phase": "generating", "step": 2, "since": <unix s>, "updated": <unix s>,
     "tokens": 212, "tokens_per_s": 11.9, "update": 1, "updates": 2, "disk": {...}}

Phases: ``loading`` (the model), ``idle`` (waiting for the coordinator), ``generating`` (with the tokens
decoded so far and their rate), ``verifying``, ``training`` (with mini-batch ``update`` of ``updates``),
``evaluating``, ``checkpointing``, ``exporting``. Written atomically (tmp file + rename), at most every
``min_interval_s`` within a phase, so a reader never sees half a file. A write that fails is logged once
and otherwise ignored: the status is a display, never a reason to fail a request.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hacrl_fed.atomic import atomic_write_text

__all__ = ["StatusFile", "TokenCounter", "disk_estimate"]

log = logging.getLogger("hacrl_fed.worker.detail")


class StatusFile:
    """Writes the worker's phase to ``path`` (None: does nothing). ``clock`` returns unix seconds."""

    def __init__(self, path: str | Path | None, agent: str, *, min_interval_s: float = 0.5,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path) if path else None
        self.clock = clock
        self.min_interval_s = min_interval_s
        self.state: dict[str, Any] = {"agent": agent, "phase": "loading", "since": clock()}
        self._written = 0.0
        self._warned = False

    def set(self, phase: str, **fields: Any) -> None:
        """Enter ``phase`` (resets its details and clock) with ``fields``; written at once."""
        keep = {k: self.state[k] for k in ("agent", "disk") if k in self.state}
        self.state = keep | {"phase": phase, "since": self.clock()} | fields
        self._write(force=True)

    def update(self, *, force: bool = False, **fields: Any) -> None:
        """Change details of the current phase; written when ``min_interval_s`` has passed since the last write
        (at once with ``force``)."""
        self.state.update(fields)
        self._write(force=force)

    @contextmanager
    def phase(self, phase: str, **fields: Any) -> Iterator[None]:
        """``phase`` while the block runs, ``idle`` after it (also when it raises)."""
        self.set(phase, **fields)
        try:
            yield
        finally:
            self.set("idle", step=self.state.get("step"))

    def _write(self, *, force: bool) -> None:
        now = self.clock()
        if self.path is None or (not force and now - self._written < self.min_interval_s):
            return
        self._written = now
        try:
            atomic_write_text(self.path, json.dumps(self.state | {"updated": now}) + "\n")
        except OSError as err:
            if not self._warned:
                log.warning("cannot write the status file %s: %s", self.path, err)
                self._warned = True


class TokenCounter:
    """Counts decoded tokens of ``generate`` on ``decoder`` and reports them to ``status`` while active.

    A forward pre-hook on the decoder: every forward over one new position of B rows is one decoding step
    of B tokens (rows that already finished count too: ``generate`` keeps them in the batch). Prefill and
    teacher-forced scoring forwards span several positions and are not counted. Costs one Python call
    per decoding step; inactive outside :meth:`counting`.
    """

    def __init__(self, decoder, status: StatusFile) -> None:
        self.status = status
        self.tokens = 0
        self.started = 0.0
        self.active = False
        self._handle = decoder.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs) -> None:
        if not self.active:
            return
        x = kwargs.get("input_ids", args[0] if args else None)
        if x is None:
            x = kwargs.get("inputs_embeds")
        if x is None or x.dim() < 2 or x.shape[1] != 1:
            return
        self.tokens += int(x.shape[0])
        elapsed = max(time.monotonic() - self.started, 1e-9)
        self.status.update(tokens=self.tokens, tokens_per_s=round(self.tokens / elapsed, 1))

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Count the tokens decoded inside the block (from 0)."""
        self.tokens, self.started, self.active = 0, time.monotonic(), True
        try:
            yield
        finally:
            self.active = False

    def close(self) -> None:
        self._handle.remove()


def disk_estimate(model, *, is_lora: bool) -> dict[str, int]:
    """Bytes a run writes for this model: ``export`` (the merged weights as a Hugging Face directory) and
    ``checkpoint`` (weights — the adapter alone with LoRA — plus AdamW's two float32 moments per trainable
    parameter). Tokenizer files and logs (a few MB) are not counted."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())      # tied weights once
    trainable = [p for p in model.parameters() if p.requires_grad]
    saved = sum(p.numel() * p.element_size() for p in trainable) if is_lora else weights
    return {"export": int(weights), "checkpoint": int(saved + 8 * sum(p.numel() for p in trainable))}
