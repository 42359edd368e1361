"""The pool of an asynchronous run (``run.mode = "async"``, docs/async.md): which peer rows each learner gets.

In an asynchronous run every site generates and trains at its own pace. The coordinator keeps every accepted,
re-verified batch here (:class:`PooledBatch`) and, when a learner's next update is due, hands it the batches of
other agents it has not trained on yet (:meth:`AsyncPool.take`). A batch is *stale* for that update when

* its source has trained more than ``max_staleness`` times since the weights that generated it
  (``staleness = #{v ∈ trained steps of the source : v > batch.model_version}``; the source's trained steps are
  the coordinator's record, :attr:`~hacrl_fed.coordinator.state.CoordinatorState.trained_steps`), or
* it was accepted more than ``max_age_s`` seconds ago (the wall-clock bound).

A stale batch is dropped for that learner and counted (per source and reason); a batch is delivered to each
learner at most once and forgotten once every learner has had it or it is stale for all. The behaviour log-probs
of a delivered row are its source's at generation, so the learner's cross ratio is the one the paper defines
(the staleness only widens the gap between behaviour and current policy, which the ratio corrects).

Pure data and arithmetic, no I/O, no clock of its own: the caller passes ``now``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["AsyncPool", "Delivery", "PooledBatch", "staleness"]


@dataclass(frozen=True)
class PooledBatch:
    """One accepted batch as the pool keeps it.

    Attributes:
        agent: the source agent (verified signer).
        step: the plan step it answers.
        version: the generating weights' version (``RolloutBatch.model_version``: the source's last trained step).
        accepted_at: when the coordinator accepted it (seconds, the caller's clock).
        envelope: the exact signed bytes to re-broadcast.
        plan: the serialized RoundPlan it answers.
        rows: rollouts in it.
        corrections: the coordinator's serialized ``RewardCorrection`` messages of this batch.
    """

    agent: str
    step: int
    version: int
    accepted_at: float
    envelope: bytes
    plan: bytes
    rows: int
    corrections: tuple[bytes, ...] = ()

    @property
    def key(self) -> str:
        """Pool key of the train order: ``agent@step``."""
        return f"{self.agent}@{self.step}"


def staleness(version: int, trained: Sequence[int]) -> int:
    """Updates the source made after the weights of ``version``: ``#{v ∈ trained : v > version}`` (≥ 0).

    ``trained``: the source's trained steps as the coordinator recorded them (any order)."""
    return sum(1 for v in trained if v > version)


@dataclass
class Delivery:
    """What :meth:`AsyncPool.take` gives one learner for one update.

    Attributes:
        batches: the peer batches to send, oldest accepted first.
        staleness: the staleness (source updates) of each of ``batches``, same order.
        dropped: rows dropped as stale, per ``(source agent, reason)``; reason ``versions`` or ``age``.
    """

    batches: list[PooledBatch] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.batches)

    @property
    def dropped_rows(self) -> int:
        return sum(self.dropped.values())


class AsyncPool:
    """Accepted batches of an asynchronous run and who has had them (module docstring).

    Args:
        max_staleness: source updates a batch may lag at delivery (``run.max_staleness``, ≥ 0).
        max_age_s: seconds since acceptance a batch may wait for delivery (``run.max_row_age_s``, > 0).
        max_batches: batches kept at most; the oldest accepted go first, counted in :attr:`evicted` (a bound on
            the coordinator's memory, whatever the learners' pace).

    Raises ValueError for a negative ``max_staleness`` or a ``max_age_s``/``max_batches`` that is not positive.
    """

    def __init__(self, max_staleness: int, max_age_s: float, *, max_batches: int = 1024) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if not max_age_s > 0:
            raise ValueError(f"max_age_s must be > 0, got {max_age_s}")
        if max_batches < 1:
            raise ValueError(f"max_batches must be >= 1, got {max_batches}")
        self.max_staleness, self.max_age_s, self.max_batches = int(max_staleness), float(max_age_s), int(max_batches)
        self.batches: list[PooledBatch] = []
        self._done: dict[str, set[str]] = {}
        """Pool key → learners that had it (delivered or dropped as stale for them)."""
        self.evicted = 0
        """Batches forgotten for room before every learner had them."""

    def add(self, batch: PooledBatch) -> None:
        """Keep ``batch``; a batch of the same ``agent@step`` replaces the one kept (a resent order's reply)."""
        self.batches = [b for b in self.batches if b.key != batch.key] + [batch]
        self._done.setdefault(batch.key, set())
        while len(self.batches) > self.max_batches:
            old = self.batches.pop(0)
            self._done.pop(old.key, None)
            self.evicted += 1

    def take(self, learner: str, *, trained: Mapping[str, Sequence[int]], now: float,
             learners: Collection[str]) -> Delivery:
        """The batches of other agents ``learner`` has not had yet, stale ones dropped (module docstring).

        Args:
            learner: the agent whose update is due.
            trained: source agent → its trained steps (the coordinator's record).
            now: the caller's clock, same as ``accepted_at``.
            learners: every agent that trains (batches every one of them has had are forgotten).

        Returns a :class:`Delivery`; every batch it delivers or drops counts as had by ``learner``.
        """
        out = Delivery()
        for batch in self.batches:
            seen = self._done[batch.key]
            if batch.agent == learner or learner in seen:
                continue
            seen.add(learner)
            lag = staleness(batch.version, trained.get(batch.agent, ()))
            if lag > self.max_staleness:
                out.dropped[(batch.agent, "versions")] += batch.rows
            elif now - batch.accepted_at > self.max_age_s:
                out.dropped[(batch.agent, "age")] += batch.rows
            else:
                out.batches.append(batch)
                out.staleness.append(lag)
        self._forget(learners, now)
        return out

    def _forget(self, learners: Collection[str], now: float) -> None:
        """Drop batches that every learner other than their source has had, or that are too old for anyone."""
        keep = []
        for batch in self.batches:
            owed = set(learners) - {batch.agent} - self._done[batch.key]
            if owed and now - batch.accepted_at <= self.max_age_s:
                keep.append(batch)
            else:
                self._done.pop(batch.key, None)
        self.batches = keep
