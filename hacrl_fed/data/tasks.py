"""Procedural task suites from ``reasoning-gym``: seeded training and held-out problems, each with its task.

``data.source = "reasoning_gym"`` (:class:`hacrl_fed.config.DataConfig`) names a list of tasks, each a
``reasoning-gym`` generator with its config (the difficulty: number of terms, digits, words …), a weight and
a label (the task name every problem carries, ``Problem.source``; two entries may use one generator at two
difficulties under two labels). ``data.eval_tasks`` are held-out task families: evaluated, never trained.

Seeds (reasoning-gym makes item ``i`` of a dataset with seed ``s`` from ``Random(s + i)``):

* held-out items of every task: generator seeds ``[0, eval_size)``, the same for every run seed;
* training items: generator seeds ``[TRAIN_SEED_BASE + data.seed · TRAIN_SEED_STRIDE, … + n)``.

The two ranges are disjoint by construction (checked), and a training item whose question text equals any
held-out question (of any task) is dropped as well, so training and held-out problems never coincide.

Answers: a reference that is a plain number (``-12``, ``0.3125``, ``7/12``) is verified by math-verify
(style ``boxed``); any other reference by the task's own scorer (style ``task:<generator>``,
:mod:`hacrl_fed.reward.task_scorers`). Either way the answer is asked for in ``\\boxed{}``
(``data.instruction``, :data:`hacrl_fed.config.DEFAULT_INSTRUCTION` by default, is appended to every
question). Only generators whose scorer needs no metadata
can be used (the metadata does not travel in a round plan): :func:`check_scorer` refuses the others.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from hacrl_fed.data.problem import DataError, Problem

if TYPE_CHECKING:
    from hacrl_fed.config import DataConfig, TaskSpec

__all__ = ["MAX_EVAL_ITEMS", "TRAIN_SEED_BASE", "TRAIN_SEED_STRIDE", "answer_style_for", "check_scorer",
           "generate_task", "load_task_problems", "task_counts"]

TRAIN_SEED_BASE = 2**31
"""First generator seed of training items (held-out items use seeds below ``MAX_EVAL_ITEMS``)."""
TRAIN_SEED_STRIDE = 2**24
"""Generator seeds reserved per run seed: at most this many training items per task."""
MAX_EVAL_ITEMS = 2**20
"""At most this many held-out items per task (far below :data:`TRAIN_SEED_BASE`)."""
SCORER_CHECK_ITEMS = 8
"""Items of each task whose reference must score 1 without metadata (:func:`check_scorer`)."""

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def answer_style_for(reference: str, generator: str) -> str:
    """``boxed`` (math-verify) for a plain number, else ``task:<generator>`` (the task's scorer).

    >>> answer_style_for("-12", "chain_sum"), answer_style_for("7/12", "dice"), answer_style_for("ssehc", "spell_backward")
    ('boxed', 'boxed', 'task:spell_backward')
    """
    return "boxed" if _NUMBER.fullmatch(reference.strip()) else f"task:{generator}"


def _dataset(spec: TaskSpec, seed: int, size: int) -> Any:
    try:
        from reasoning_gym.factory import DATASETS, create_dataset
    except ImportError as err:  # pragma: no cover - a dependency of the package
        raise DataError(f"data.source = 'reasoning_gym' needs the reasoning-gym package: {err}") from None
    if spec.name not in DATASETS:
        near = sorted(n for n in DATASETS if n[:3] == spec.name[:3])
        raise DataError(f"task {spec.label!r}: reasoning-gym has no generator {spec.name!r}"
                        + (f" (similar: {', '.join(near)})" if near else ""))
    try:
        return create_dataset(spec.name, seed=seed, size=size, **spec.config)
    except (TypeError, ValueError, AssertionError, KeyError) as err:
        raise DataError(f"task {spec.label!r}: bad config for generator {spec.name!r}: "
                        f"{type(err).__name__}: {' '.join(str(err).split())[:300]}") from None


def check_scorer(spec: TaskSpec, items: Sequence[dict[str, Any]], dataset: Any) -> None:
    """Raise :class:`DataError` unless the task's scorer gives every reference among ``items`` the score 1 from
    the question and the answer alone (what a round plan carries), and gives a wrong answer the same score with
    and without the item's metadata."""
    for e in items[:SCORER_CHECK_ITEMS]:
        bare = {"question": e["question"], "answer": str(e["answer"]), "metadata": {}}
        try:
            ok = float(dataset.score_answer(str(e["answer"]), bare)) == 1.0
            ok = ok and dataset.score_answer("\u2205", bare) == dataset.score_answer("\u2205", e)
        except Exception:  # noqa: BLE001 - a scorer that needs metadata raises KeyError, TypeError …
            ok = False
        if not ok:
            raise DataError(f"task {spec.label!r}: the scorer of {spec.name!r} needs the item's metadata, which "
                            "does not travel in a round plan; choose another generator")


def generate_task(spec: TaskSpec, *, seed: int, size: int, held_out: bool, instruction: str) -> list[Problem]:
    """``size`` problems of one task: held-out items (generator seeds ``0 … size−1``) or training items of run
    seed ``seed``. Ids are ``<label>-<generator seed>``; ``source`` is the label.

    Raises :class:`DataError` for an unknown generator, a bad config, a scorer that needs metadata, or a size
    out of range.
    """
    limit = MAX_EVAL_ITEMS if held_out else TRAIN_SEED_STRIDE
    if not 0 <= size <= limit:
        raise DataError(f"task {spec.label!r}: {size} {'held-out' if held_out else 'training'} items requested, "
                        f"at most {limit}")
    first = 0 if held_out else TRAIN_SEED_BASE + seed * TRAIN_SEED_STRIDE
    ds = _dataset(spec, first, max(size, 1))
    try:
        items = [ds[i] for i in range(size)]
    except Exception as err:  # noqa: BLE001 - a generator fails on configs it accepted (weights vs operators …)
        raise DataError(f"task {spec.label!r}: generator {spec.name!r} failed with its config: "
                        f"{type(err).__name__}: {' '.join(str(err).split())[:300]}") from None
    check_scorer(spec, items or [ds[0]], ds)
    out = []
    for i, e in enumerate(items):
        answer = str(e["answer"]).strip()
        question = str(e["question"]).strip()
        if not question or not answer:
            raise DataError(f"task {spec.label!r}: item {first + i} has an empty question or answer")
        text = f"{question}\n\n{instruction}" if instruction else question
        out.append(Problem(f"{spec.label}-{first + i}", text, answer, answer_style_for(answer, spec.name),
                           spec.label))
    return out


def task_counts(specs: Sequence[TaskSpec], total: int) -> list[int]:
    """Training items per task: ``total`` split in proportion to the weights (largest remainders), each ≥ 1.

    >>> from types import SimpleNamespace as S
    >>> task_counts([S(weight=1.0), S(weight=3.0)], 10)
    [3, 7]
    """
    weights = [float(s.weight) for s in specs]
    exact = [total * w / sum(weights) for w in weights]
    counts = [max(1, int(x)) for x in exact]
    for i in sorted(range(len(specs)), key=lambda i: int(exact[i]) - exact[i])[: max(0, total - sum(counts))]:
        counts[i] += 1
    return counts


def _disjoint(train: Iterable[Problem], held: Iterable[Problem]) -> list[Problem]:
    held_texts = {p.problem for p in held}
    return [p for p in train if p.problem not in held_texts]


def load_task_problems(cfg: DataConfig) -> tuple[list[Problem], list[Problem]]:
    """``(train, held_out)`` of a ``reasoning_gym`` source.

    ``train``: ``cfg.num_problems`` items split over ``cfg.tasks`` by weight, seeded by ``cfg.seed``, no text
    equal to a held-out one. ``held_out``: ``cfg.eval_size`` items of every task of ``cfg.tasks`` and of
    ``cfg.eval_tasks`` (the held-out families), the same for every run seed. Raises :class:`DataError`.
    """
    train: list[Problem] = []
    for spec, n in zip(cfg.tasks, task_counts(cfg.tasks, cfg.num_problems), strict=True):
        train += generate_task(spec, seed=cfg.seed, size=n, held_out=False, instruction=cfg.instruction)
    held: list[Problem] = []
    for spec in [*cfg.tasks, *cfg.eval_tasks]:
        held += generate_task(spec, seed=cfg.seed, size=cfg.eval_size, held_out=True, instruction=cfg.instruction)
    ids = [p.id for p in train + held]
    if len(set(ids)) != len(ids):  # seed ranges overlap: a bug, not a data problem
        raise DataError("training and held-out task items share a generator seed")
    return _disjoint(train, held), held
