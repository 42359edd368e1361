"""Seeded, resumable prompt sampler: epoch-wise shuffling without replacement.

Epoch ``e`` visits every problem exactly once, in a permutation determined by ``(seed, e)`` alone,
so the position ``(epoch, offset)`` is the whole state: :meth:`PromptSampler.state_dict` /
:meth:`PromptSampler.load_state_dict` resume to exactly the batch that would have come next.
A batch that reaches the end of an epoch is completed from the next epoch's permutation.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence
from typing import Any

from hacrl_fed.data.problem import Problem

__all__ = ["PromptSampler"]

_STATE_VERSION = 1


def _fingerprint(problems: Sequence[Problem]) -> str:
    h = hashlib.sha256()
    for p in problems:
        h.update(p.id.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


class PromptSampler:
    """Batches of ``batch_size`` problems, reshuffled every epoch, deterministic per ``seed``.

    Args:
        problems: the training set (order matters for the fingerprint, not for the sampling).
        batch_size: B, prompts per step; ``1 <= B <= len(problems)``.
        seed: the run seed.

    Raises ``ValueError`` for an empty problem list or a batch size out of range.

    >>> from hacrl_fed.data.arithmetic import generate
    >>> s = PromptSampler(generate(10, 1, 0), batch_size=4, seed=0)
    >>> first = s.next_batch(); state = s.state_dict(); second = s.next_batch()
    >>> s2 = PromptSampler(generate(10, 1, 0), batch_size=4, seed=0); s2.load_state_dict(state)
    >>> s2.next_batch() == second
    True
    """

    def __init__(self, problems: Sequence[Problem], batch_size: int, seed: int = 0) -> None:
        if not problems:
            raise ValueError("PromptSampler needs at least one problem")
        if not 1 <= batch_size <= len(problems):
            raise ValueError(f"batch_size must be in 1..{len(problems)} (the number of problems), got {batch_size}")
        self.problems = list(problems)
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        """Epochs completed before the current position."""
        self.offset = 0
        """Problems already drawn from the current epoch's permutation."""
        self._fingerprint = _fingerprint(self.problems)
        self._order_epoch = -1
        self._order: list[int] = []

    def _permutation(self, epoch: int) -> list[int]:
        if epoch != self._order_epoch:
            order = list(range(len(self.problems)))
            random.Random(f"hacrl-sampler:{self.seed}:{epoch}").shuffle(order)
            self._order, self._order_epoch = order, epoch
        return self._order

    def next_batch(self) -> list[Problem]:
        """The next ``batch_size`` problems (advances the state)."""
        batch: list[Problem] = []
        while len(batch) < self.batch_size:
            order = self._permutation(self.epoch)
            take = min(self.batch_size - len(batch), len(order) - self.offset)
            batch.extend(self.problems[i] for i in order[self.offset : self.offset + take])
            self.offset += take
            if self.offset == len(order):
                self.epoch, self.offset = self.epoch + 1, 0
        return batch

    def __iter__(self) -> Iterator[list[Problem]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable position (plus checks that the data and batch size are unchanged)."""
        return {"version": _STATE_VERSION, "seed": self.seed, "epoch": self.epoch, "offset": self.offset,
                "batch_size": self.batch_size, "num_problems": len(self.problems), "fingerprint": self._fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position from :meth:`state_dict`.

        Raises ``ValueError`` if the state is malformed or was saved for other problems, another
        seed or another batch size (resuming would not reproduce the run).
        """
        try:
            version, epoch, offset = int(state["version"]), int(state["epoch"]), int(state["offset"])
            checks = {k: state[k] for k in ("seed", "batch_size", "num_problems", "fingerprint")}
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"malformed sampler state: {err!r}") from None
        if version != _STATE_VERSION:
            raise ValueError(f"sampler state version {version} is not supported (expected {_STATE_VERSION})")
        mine = {"seed": self.seed, "batch_size": self.batch_size, "num_problems": len(self.problems),
                "fingerprint": self._fingerprint}
        diff = [f"{k}: saved {checks[k]!r}, now {mine[k]!r}" for k in mine if checks[k] != mine[k]]
        if diff:
            raise ValueError("sampler state does not match this run (" + "; ".join(diff) + ")")
        if epoch < 0 or not 0 <= offset < len(self.problems):
            raise ValueError(f"sampler state out of range: epoch {epoch}, offset {offset}")
        self.epoch, self.offset = epoch, offset
