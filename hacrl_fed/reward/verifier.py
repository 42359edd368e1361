"""The verifier: :func:`~hacrl_fed.reward.compare.check_answer` in a killable process pool.

Every item runs in a worker process under a hard limit of ``VerifierConfig.timeout_s`` seconds of
the worker's CPU time, so a busy machine does not turn right answers into errors; an item that
overruns is retried once with twice the limit (by default), and a generous wall-clock backstop
still kills a stuck worker (:class:`~hacrl_fed.reward.pool.KillablePool`). An item that still
overruns, or crashes, becomes a ``verifier_error`` verdict (reward 0, counted), never a stuck
round; each :meth:`Verifier.verify` result says how many of its items timed out or were retried
(:class:`VerdictList`). Per call, each *source* (``sources``: the agent whose row it is) may spend at
most ``source_budget_s`` CPU seconds in all: once it has, its remaining rows are not verified but refused,
``verifier_error`` with the reason ``source_budget: …`` (reward 0), so that one site's crafted answers
cannot buy minutes of everyone's verifier CPU per step. Usable from the main thread and from worker threads (a gRPC servicer): no
signals are used in the caller, and math-verify's own signal timeouts are disabled in the workers.

Two faces:

* :class:`Verifier` — the framework's API: ``verify(responses, references, styles)`` → verdicts.
* :class:`AccuracyReward` / :data:`accuracy_reward` — a TRL-style reward function
  ``(completions, solution, **kwargs) -> list[float | None]`` (``None`` = unverifiable).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hacrl_fed.registries import ANSWER_STYLES
from hacrl_fed.reward.compare import check_answer, warm_up
from hacrl_fed.protocol.episodes import EPISODE_STYLE
from hacrl_fed.reward.extract import check_style
from hacrl_fed.reward.pool import KillablePool, MapStats
from hacrl_fed.reward.verdict import Verdict

if TYPE_CHECKING:
    from hacrl_fed.config import VerifierConfig

__all__ = ["AccuracyReward", "CheckItem", "VerdictList", "Verifier", "accuracy_reward", "verify_by_source"]


class CheckItem:
    """Picklable per-item job for the pool: ``(response, reference, style, problem)`` → verdict
    fields. A callable class (not a closure) so that ``spawn`` can send it to worker processes; it carries the
    answer styles registered in the sending process (as import paths, :meth:`Registry.added
    <hacrl_fed.registries.Registry.added>`), which the worker process registers in turn."""

    def __getstate__(self) -> dict[str, Any]:
        return {"styles": ANSWER_STYLES.added()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        ANSWER_STYLES.restore(state.get("styles", {}))

    def __call__(self, item: tuple[str, str, str, str | None]) -> tuple[str, float, str, str | None]:
        v = check_answer(*item)
        return (v.verdict, v.reward, v.reason, v.extracted)

    @staticmethod
    def warm_up() -> None:
        warm_up()


class VerdictList(list):
    """The verdicts of one :meth:`Verifier.verify` call (a ``list`` of :class:`Verdict`, in item
    order) with that call's timeout counts, for logs and metrics.

    Attributes:
        timeouts: items that are ``verifier_error`` because they overran their limit (after the retry).
        retried: items that overran the first limit and were run again with the longer one; those
            not counted in ``timeouts`` were rescued by the retry.
    """

    def __init__(self, verdicts=(), timeouts: int = 0, retried: int = 0, over_budget: int = 0) -> None:
        super().__init__(verdicts)
        self.timeouts, self.retried, self.over_budget = timeouts, retried, over_budget

    def __reduce__(self):
        return (VerdictList, (list(self), self.timeouts, self.retried, self.over_budget))


def _broadcast(value: str | Sequence[str] | None, n: int, name: str) -> list[Any]:
    if value is None or isinstance(value, str):
        return [value] * n
    out = list(value)
    if len(out) != n:
        raise ValueError(f"{name} has {len(out)} entries, expected {n} (one per response)")
    return out


class Verifier:
    """Tri-state answer verification in ``workers`` processes with a hard per-item timeout.

    Args:
        timeout_s: CPU seconds per item (the worker process's user + system time, not affected by
            machine load); beyond it the worker is killed and replaced and the item retried with
            ``retry_factor`` × the limit; if it overruns again it is ``verifier_error`` with a reason
            starting ``timeout`` (``timeout after 10 s CPU``).
        workers: processes in the pool.
        memory_limit_mb: address-space cap per worker (``None`` = none).
        wall_timeout_s: wall-clock backstop per item for a worker stuck without computing
            (default ``max(60, 10 × timeout_s)``; reason ``timeout after 60 s wall-clock``, no retry).
        retries: runs after a CPU-limit overrun (default 1; 0 = none).
        retry_factor: limit multiplier per retry (default 2).
        source_budget_s: CPU seconds one source's items may use in one :meth:`verify` call (``sources``
            given); its later items are refused (``verifier_error``, reason ``source_budget: …``). None: no bound.

    Use as a context manager (or call :meth:`close`); the pool starts on ``__enter__`` or on the
    first :meth:`verify`. Pickling keeps only the settings: an unpickled copy starts its own pool.
    """

    def __init__(self, timeout_s: float = 5.0, workers: int = 2, *, memory_limit_mb: int | None = 2048,
                 wall_timeout_s: float | None = None, retries: int = 1, retry_factor: float = 2.0,
                 source_budget_s: float | None = None) -> None:
        if source_budget_s is not None and not source_budget_s > 0:
            raise ValueError(f"source_budget_s must be > 0, got {source_budget_s}")
        self.timeout_s, self.workers, self.memory_limit_mb = float(timeout_s), int(workers), memory_limit_mb
        self.source_budget_s = source_budget_s
        self._pool = KillablePool(CheckItem(), workers=self.workers, timeout_s=self.timeout_s,
                                  memory_limit_mb=memory_limit_mb, wall_timeout_s=wall_timeout_s,
                                  retries=retries, retry_factor=retry_factor)
        self.wall_timeout_s, self.retries, self.retry_factor = (self._pool.wall_timeout_s, self._pool.retries,
                                                                self._pool.retry_factor)

    @classmethod
    def from_config(cls, cfg: VerifierConfig) -> Verifier:
        """Build from ``[verifier]`` of a config file (``timeout_s``, ``workers``, ``source_budget_s``)."""
        return cls(timeout_s=cfg.timeout_s, workers=cfg.workers, source_budget_s=cfg.source_budget_s)

    @property
    def restarts(self) -> int:
        """Workers replaced so far after a timeout or crash."""
        return self._pool.restarts

    @property
    def timeouts(self) -> int:
        """Items that ended as ``timeout`` verdicts so far, over all calls (per call: :class:`VerdictList`)."""
        return self._pool.timeouts

    @property
    def retried(self) -> int:
        """Items retried so far after overrunning their first limit, over all calls."""
        return self._pool.retried

    def verify(self, responses: Sequence[str], references: Sequence[str],
               styles: str | Sequence[str] = "boxed", problems: str | Sequence[str] | None = None, *,
               sources: Sequence[str] | None = None) -> VerdictList:
        """Verdicts for ``responses[i]`` against ``references[i]``, in order, as a
        :class:`VerdictList` (a list that also carries this call's ``timeouts`` and ``retried``).

        Args:
            responses: model responses (text, special tokens stripped).
            references: reference final answers (or worked solutions ending in ``\\boxed{}``/``####``).
            styles: ``boxed`` or ``gsm8k`` per item, or one style for all.
            problems: problem texts (enables the restated-problem check), or ``None``.
            sources: the source (agent) of each response: with ``source_budget_s`` set, each source's CPU in
                this call is bounded (module docstring); ``None``: no per-source bound.

        Raises ``ValueError`` for mismatched lengths, an unknown style or a non-string input;
        ``RuntimeError`` if the worker processes cannot start.
        """
        n = len(responses)
        refs = _broadcast(references, n, "references") if not isinstance(references, str) else None
        if refs is None:
            raise ValueError("references must be a sequence with one reference per response")
        style_list = _broadcast(styles, n, "styles")
        problem_list = _broadcast(problems, n, "problems")
        for i in range(n):
            if not isinstance(responses[i], str) or not isinstance(refs[i], str):
                raise ValueError(f"item {i}: response and reference must be str")
            try:
                if style_list[i] != EPISODE_STYLE:   # an episode, replayed (hacrl_fed.reward.episode_check)
                    check_style(style_list[i])
            except ValueError as err:
                raise ValueError(f"item {i}: {err}") from None
        items = list(zip(responses, refs, style_list, problem_list, strict=True))
        groups = None if sources is None else _broadcast(sources, n, "sources")
        budget = self.source_budget_s if groups is not None else None
        outcomes, stats = (self._pool.map_with_stats(items, groups=groups, group_budget_s=budget) if items
                           else ([], MapStats()))
        return VerdictList([self._to_verdict(o) for o in outcomes], stats.timeouts, stats.retried, stats.over_budget)

    def verify_one(self, response: str, reference: str, style: str = "boxed", problem: str | None = None) -> Verdict:
        """:meth:`verify` for a single item."""
        return self.verify([response], [reference], [style], None if problem is None else [problem])[0]

    def _to_verdict(self, outcome: tuple[str, Any]) -> Verdict:
        kind, value = outcome
        if kind == "ok":
            return Verdict(*value)
        if kind == "timeout":
            return Verdict.error(f"timeout after {value}")
        if kind == "crash":
            return Verdict.error(f"worker crashed (exit code {value})")
        if kind == "budget":
            return Verdict.error(f"source_budget: refused, the source's verifier CPU for the step ({value}) is spent")
        return Verdict.error(f"error: {value}")

    def start(self) -> Verifier:
        self._pool.start()
        return self

    def close(self) -> None:
        """Stop the worker processes (idempotent; a later :meth:`verify` starts new ones)."""
        self._pool.close()

    def __enter__(self) -> Verifier:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"timeout_s": self.timeout_s, "workers": self.workers, "memory_limit_mb": self.memory_limit_mb,
                "wall_timeout_s": self.wall_timeout_s, "retries": self.retries, "retry_factor": self.retry_factor,
                "source_budget_s": self.source_budget_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["timeout_s"], state["workers"], memory_limit_mb=state["memory_limit_mb"],
                      wall_timeout_s=state["wall_timeout_s"], retries=state["retries"],
                      retry_factor=state["retry_factor"], source_budget_s=state.get("source_budget_s"))


def verify_by_source(verify: Any, columns: Sequence[Any], sources: Sequence[str]) -> list:
    """``verify(*columns)`` with each row's source when ``verify`` is a :class:`Verifier`'s (whose
    ``source_budget_s`` then bounds each source's CPU); any other verify function (a test's) as it is."""
    if isinstance(getattr(verify, "__self__", None), Verifier):
        return verify(*columns, sources=sources)
    return verify(*columns)


def _completion_text(completion: Any) -> str:
    """TRL completions are strings or chat lists ``[{"role": "assistant", "content": ...}]``."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise ValueError(f"unsupported completion format: {type(completion).__name__}")


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
    return ""


class AccuracyReward:
    """TRL-style accuracy reward: ``(completions, solution, **kwargs) -> list[float | None]``.

    1.0 correct, 0.0 incorrect, ``None`` when the verifier could not decide (``verifier_error``:
    timeout, unparseable reference) so that TRL ignores the row instead of scoring it 0. Columns
    ``answer`` (if ``solution`` is absent), ``answer_style`` and ``problem`` are used when present;
    otherwise the prompt text serves for the restated-problem check.

    A callable class rather than a closure so that it pickles into worker processes; the process
    pool is not pickled and starts lazily in whichever process calls it.
    """

    __name__ = "accuracy_reward"  # TRL logs reward functions by __name__

    def __init__(self, answer_style: str = "boxed", timeout_s: float = 5.0, workers: int = 2) -> None:
        check_style(answer_style)
        self.answer_style, self.timeout_s, self.workers = answer_style, timeout_s, workers
        self._verifier: Verifier | None = None

    def __call__(self, completions: Sequence[Any], solution: Sequence[str] | None = None,
                 **kwargs: Any) -> list[float | None]:
        solution = solution if solution is not None else kwargs.get("answer")
        if solution is None:
            raise ValueError("accuracy_reward needs a `solution` (or `answer`) column")
        texts = [_completion_text(c) for c in completions]
        problems = kwargs.get("problem")
        if problems is None and kwargs.get("prompts") is not None:
            problems = [_prompt_text(p) for p in kwargs["prompts"]]
        if self._verifier is None:
            self._verifier = Verifier(self.timeout_s, self.workers)
        verdicts = self._verifier.verify(texts, list(solution), kwargs.get("answer_style") or self.answer_style,
                                         problems)
        return [None if v.is_error else v.reward for v in verdicts]

    def close(self) -> None:
        if self._verifier is not None:
            self._verifier.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"answer_style": self.answer_style, "timeout_s": self.timeout_s, "workers": self.workers}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)


accuracy_reward = AccuracyReward()
"""Default instance (``boxed`` style, 5 s, 2 workers); its pool starts on the first call."""
