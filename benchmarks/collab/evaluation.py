"""Evaluation of the collaboration benchmark: which held-out sets a run evaluates on (:func:`eval_sets_for`), and
greedy evaluation of every learner on them (:func:`evaluate_sets`), before training (:func:`evaluate_before`) and
after each cell."""

from __future__ import annotations

import time


def evaluate_sets(fed, evaluate, eval_sets: dict) -> tuple[dict, dict]:
    """``evaluate`` on every evaluation set: (agent → set → {problem id: result}, agent → set → {problem id:
    response text}); the texts only when ``evaluate`` is ``fed.evaluate_outcomes`` (task suites), else ``{}``."""
    after: dict = {}
    texts: dict = {}
    for name, problems in eval_sets.items():
        said: dict = {}
        per = evaluate(problems, responses=said) if evaluate == fed.evaluate_outcomes else evaluate(problems)
        for a, res in per.items():
            after.setdefault(a, {})[name] = res
        for a, res in said.items():
            texts.setdefault(a, {})[name] = res
    return after, texts


def eval_sets_for(fed, cfg, suite: bool) -> tuple[dict, object, dict | None]:
    """The evaluation sets of a run on the federation ``fed`` (:class:`inproc.Federation`) of config ``cfg``:
    ``(set name → problems, the evaluate function, problem id → task or None)``.

    * a task suite (``suite``): ``held_out`` (held-out items of the trained tasks) and ``families`` (the held-out
      task families), empty ones left out, each problem's outcome (``fed.evaluate_outcomes``); the task of every
      held-out problem is returned for ``meta.json``;
    * episodes: ``held_out``, each game's reward (``fed.evaluate_rewards``: won at 1, else how close it came);
    * otherwise ``held_out`` and ``words`` (the same problems reworded, :func:`hacrl_fed.data.arithmetic.reword`,
      left out where a problem cannot be reworded), right or wrong (``fed.evaluate``)."""
    from hacrl_fed.data.arithmetic import reword

    if suite:
        trained = {t.label for t in cfg.run.data.tasks}
        eval_sets = {"held_out": [p for p in fed.held_out if p.source in trained],
                     "families": [p for p in fed.held_out if p.source not in trained]}
        eval_sets = {k: v for k, v in eval_sets.items() if v}
        return eval_sets, fed.evaluate_outcomes, {p.id: p.source for p in fed.held_out}
    if cfg.run.data.source == "episodes":
        return {"held_out": list(fed.held_out)}, fed.evaluate_rewards, None
    eval_sets = {"held_out": list(fed.held_out)}
    try:
        eval_sets["words"] = [reword(p) for p in fed.held_out]
    except ValueError:
        pass
    return eval_sets, fed.evaluate, None


def evaluate_before(fed, evaluate, eval_sets: dict) -> dict:
    """``before.json``: every learner evaluated on ``eval_sets`` before training (:func:`evaluate_sets`), with the
    evaluation's and the federation's load seconds, and the response texts where ``evaluate`` keeps them."""
    t = time.perf_counter()
    res, texts = evaluate_sets(fed, evaluate, eval_sets)
    before = {"agents": {a: res[a] for a in fed.learners},
              "eval_s": time.perf_counter() - t, "load_s": fed.load_s}
    if texts:
        before["responses"] = {a: texts[a] for a in fed.learners}
    return before
