"""Several reward functions with weights (TRL ``reward_funcs`` / ``reward_weights``), computed by each learner.

A reward function is a plain callable with TRL's signature::

    def my_reward(prompts: list[str], completions: list[str], **kwargs) -> list[float | None]

one value per completion; ``None`` means "does not apply" and counts as 0 in the weighted sum (TRL
ignores it the same way, through a NaN-sum). The keyword columns passed are ``answer`` (the reference
final answer), ``answer_style``, ``source_agent`` (who generated the completion) and ``finish_reason``
(``stop`` | ``length``); a function should accept ``**kwargs`` for the others. ``prompts`` are the problem
texts, ``completions`` the response texts, exactly as shared on the wire.

Names: ``accuracy`` (the verified verdict, 1 correct / 0 otherwise: the coordinator's re-verified reward,
never recomputed here), ``format`` (:func:`format_reward`), or an import path ``package.module:function``.

Design (why the training reward never crosses the wire): only the accuracy reward does, and the
coordinator re-verifies it and computes every agent's capability P̂ from it alone. A weighted extra
reward computed at its source could not be re-verified, so each learner computes its own extra rewards
itself, for every row it trains on — its own and its peers' — from the text it holds. A peer can then
not inflate the reward another site trains on, and a site's choice of reward functions stays its own.
"""

from __future__ import annotations

import importlib
import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hacrl_fed.reward.extract import extract_final_answer, is_answer_style, last_boxed, registered_style

__all__ = ["ACCURACY", "RewardFunction", "WeightedRewards", "format_reward", "load_reward_function",
           "weighted_rewards"]

ACCURACY = "accuracy"
"""The verified accuracy reward (the coordinator's verdict wins), taken as given, never recomputed."""

_HASHES = re.compile(r"####\s*\S")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def format_reward(prompts: Sequence[str], completions: Sequence[str], *, answer_style: Sequence[str] | None = None,
                  **kwargs: Any) -> list[float]:
    """1.0 when the completion states its final answer in the demanded form, else 0.0.

    ``boxed`` style: a closed, non-empty ``\\boxed{…}``; ``gsm8k`` style: that or a ``#### N`` line; another
    registered style: that or an answer its ``extract`` finds.

    >>> format_reward(["2 + 3?"] * 3, ["so \\\\boxed{5}", "the answer is 5", "\\\\boxed{"])
    [1.0, 0.0, 0.0]
    >>> format_reward(["x"], ["#### 18"], answer_style=["gsm8k"])
    [1.0]
    """
    styles = list(answer_style) if answer_style is not None else ["boxed"] * len(completions)
    out = []
    for text, style in zip(completions, styles, strict=True):
        stated = bool(last_boxed(text)) or (style == "gsm8k" and _HASHES.search(text) is not None) or (
            is_answer_style(style) and registered_style(style) is not None
            and extract_final_answer(text, style) is not None)
        out.append(1.0 if stated else 0.0)
    return out


_BUILTIN: Mapping[str, Callable[..., list]] = {"format": format_reward}


def load_reward_function(name: str) -> Callable[..., list] | None:
    """The callable for ``name``: None for ``accuracy`` (given, not computed), a built-in, or ``module:attr``.

    Raises ``ValueError`` with one line for an unknown name, a module that does not import, or an attribute
    that is missing or not callable.
    """
    if name == ACCURACY:
        return None
    if name in _BUILTIN:
        return _BUILTIN[name]
    if not _IMPORT_PATH.match(name):
        raise ValueError(f"unknown reward function {name!r}; valid: accuracy, {', '.join(_BUILTIN)}, "
                         "or an import path package.module:function")
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any import failure of user code is the same one-line error
        raise ValueError(f"reward function {name!r}: cannot import {module_name}: {type(err).__name__}: "
                         f"{' '.join(str(err).split())[:200]}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward function {name!r}: {module_name} has no callable {attr!r}")
    return fn


@dataclass(frozen=True)
class RewardFunction:
    """One weighted term of the training reward: ``name`` (metrics label), ``weight``, ``fn`` (None = accuracy)."""

    name: str
    weight: float
    fn: Callable[..., list] | None

    @property
    def label(self) -> str:
        """Metrics label: the function name of an import path, else the name."""
        return self.name.rpartition(":")[2]


@dataclass(frozen=True)
class WeightedRewards:
    """R_i = Σ_f w_f · r_f(i) over the configured functions (TRL ``reward_weights``).

    Raises ``ValueError`` (naming the function) when a function raises, returns the wrong number of values,
    or a value that is neither a finite number nor None.
    """

    functions: tuple[RewardFunction, ...]

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], accuracy: Sequence[float],
                 **columns: Sequence[Any]) -> tuple[list[float], dict[str, float]]:
        """(total reward per completion, mean of each function's raw values) for ``len(completions)`` rows."""
        n = len(completions)
        totals = [0.0] * n
        means: dict[str, float] = {}
        for f in self.functions:
            values = list(accuracy) if f.fn is None else self._call(f, prompts, completions, columns)
            if len(values) != n:
                raise ValueError(f"reward function {f.name!r} returned {len(values)} values for {n} completions")
            clean = [0.0 if v is None else _number(f.name, v) for v in values]
            totals = [t + f.weight * v for t, v in zip(totals, clean, strict=True)]
            means[f.label] = sum(clean) / n if n else 0.0
        return totals, means

    @staticmethod
    def _call(f: RewardFunction, prompts, completions, columns) -> list:
        try:
            values = f.fn(list(prompts), list(completions), **{k: list(v) for k, v in columns.items()})
        except Exception as err:  # noqa: BLE001 - a failing user function fails the step with its name
            raise ValueError(f"reward function {f.name!r} failed: {type(err).__name__}: "
                             f"{' '.join(str(err).split())[:200]}") from None
        if not isinstance(values, Sequence) or isinstance(values, (str, bytes)):
            raise ValueError(f"reward function {f.name!r} must return a list of floats, got {type(values).__name__}")
        return list(values)


def _number(name: str, value: Any) -> float:
    if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(f"reward function {name!r} returned {value!r}; expected a finite number or None")
    return float(value)


def weighted_rewards(specs: Sequence[Any]) -> WeightedRewards | None:
    """The :class:`WeightedRewards` of ``specs`` (objects with ``name`` and ``weight``, e.g. ``agent.reward_funcs``);
    None for none (the verified accuracy alone). Raises ``ValueError`` as :func:`load_reward_function`."""
    if not specs:
        return None
    return WeightedRewards(tuple(RewardFunction(s.name, float(s.weight), load_reward_function(s.name)) for s in specs))
