"""Running the collaboration benchmark's cells: one (recipe, seed) cell from the initial weights through
:mod:`inproc` (:func:`run_cell`), what a cell records per learner and step (:func:`_step_summary`, and for a
rollout-only contributor :func:`contributor_rows` / :func:`contributor_step`), and the resumable loop over the
missing cells (:func:`run_benchmark`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from collab.evaluation import evaluate_before, evaluate_sets, eval_sets_for
from collab.recipes import ALGO, CONTRIB
from collab.results import summarize
from collab.scoring import accuracy


def _step_summary(agent: str, step, contributors=()) -> dict:
    """One learner's step in a cell; ``peers``: the other learners' per-source metrics, ``screened_out`` the rows the
    learner's screens dropped or cut (a rollout-only site in ``contributors`` is recorded apart,
    :func:`contributor_rows`)."""
    rep = step.reports.get(agent, {"metrics": {}, "per_source": {}})
    peers = {src: {k: m.get(k) for k in ("rows", "grad_frac", "s_mean", "s_min", "s_max", "clip_low", "clip_high",
                                          "pos_adv_rows", "pos_adv_grad_rows", "dropped_truncated",
                                          "distill_rows", "screened_out")}
             for src, m in rep["per_source"].items() if src != agent and src not in contributors}
    own = rep["per_source"].get(agent, {})
    gen = step.generate_metrics.get(agent, {})
    return {"step": step.step, "accuracy": step.accuracy.get(agent), "stop_frac": gen.get("stop_frac"),
            "generate_s": step.generate_s.get(agent), "train_s": step.train_s.get(agent),
            "own_grad_frac": own.get("grad_frac"), "updates": rep["metrics"].get("updates"),
            "zero_grad_updates": rep["metrics"].get("zero_grad_updates"), "peers": peers,
            **({"turns_mean": gen["episode/turns_mean"], "done_frac": gen.get("episode/done_frac")}
               if "episode/turns_mean" in gen else {})}


def contributor_rows(step, learner: str, contributor: str) -> dict:
    """Where the rollout-only ``contributor``'s rows went in ``learner``'s update at one step (``step``: an
    :class:`inproc.StepResult`). Counts of rows (one row = one response):

    * ``delivered``: rows of the contributor's batch in the pool (B·G when the coordinator accepted it, 0 when
      its endpoint failed or the coordinator rejected it);
    * ``rejected_by_learner``: the learner left the whole batch out (its ``TrainReport.rejected`` names it);
    * ``screened_out``: rows the learner's screens dropped or cut (``src/<c>/screened_out``);
      ``dropped_truncated``: rows the learner dropped as cut by its ``max_response_tokens``;
    * ``rows``: the contributor's rows in the learner's update (``src/<c>/rows``), of them ``no_logprob_rows``
      without a behaviour log-prob (trained by ``algo.missing_behaviour_logprob``);
    * ``grad_rows``: rows whose term in the loss carried a gradient = ``rows`` × ``src/<c>/grad_frac``, the
      share of the rows' loss terms with ``has_grad`` (A ≠ 0 after the screens' weight, inside the loss mask, not
      dropped by the no-log-prob rule — ``success_only`` keeps only A > 0 — nor clamped by the cross window, ω ≠
      0); with ``optim.epochs`` > 1 the mean over the epochs (exact row count at 1 epoch, the default). It
      counts terms, not applied steps (an update skipped as non-finite or all-zero still counts);
    * ``pos_adv_rows`` / ``pos_adv_grad_rows``: loss terms with A > 0, and those of them with a gradient, summed
      over the epochs;
    * ``distill_rows``: rows of the peer distillation term (``algo.peer_distill_coef`` > 0; 0 otherwise), summed
      over the epochs: they carry the supervised gradient whether or not their HACPO term does.
    """
    rep = step.reports.get(learner, {"metrics": {}, "per_source": {}, "rejected": []})
    m = rep["per_source"].get(contributor, {})
    rows = m.get("rows", 0.0)
    delivered = step.generate_metrics.get(contributor, {}).get("rollouts", 0.0) \
        if contributor in step.contributed else 0.0
    left_out = any(r.startswith(f"{contributor}:") for r in rep["rejected"])
    return {"delivered": delivered, "rejected_by_learner": left_out,
            "screened_out": m.get("screened_out", 0.0), "dropped_truncated": m.get("dropped_truncated", 0.0),
            "rows": rows, "no_logprob_rows": m.get("no_logprob_rows", 0.0),
            "grad_rows": rows * m.get("grad_frac", 0.0), "pos_adv_rows": m.get("pos_adv_rows", 0.0),
            "pos_adv_grad_rows": m.get("pos_adv_grad_rows", 0.0), "distill_rows": m.get("distill_rows", 0.0)}


def contributor_step(step, contributor: str) -> dict:
    """The rollout-only site at one step: pooled or why not, its coordinator-verified accuracy, rows, seconds."""
    gen = step.generate_metrics.get(contributor, {})
    return {"step": step.step, "accepted": contributor in step.contributed, "rejected": step.rejected.get(contributor),
            "accuracy": step.accuracy.get(contributor), "rollouts": gen.get("rollouts"),
            "behaviour_logprob_rows": gen.get("behaviour_logprob_rows"), "stop_frac": gen.get("stop_frac"),
            "generate_s": step.generate_s.get(contributor)}


def _progress_line(recipe: str, seed: int, steps: int, result, elapsed_s: float) -> str:
    """One line per finished step of a cell: ``[recipe sN] step k/steps, T s (≈ L s left): rollouts right agent
    P_t % …`` (T: seconds since the cell started; L: seconds left at this pace; P_t: the coordinator-verified mean
    reward of the agent's rollouts at the step)."""
    acc = " ".join(f"{a} {100 * p:.0f} %" for a, p in sorted(result.accuracy.items()))
    left = elapsed_s / result.step * (steps - result.step)
    return f"[{recipe} s{seed}] step {result.step}/{steps}, {elapsed_s:.0f} s (≈ {left:.0f} s left): rollouts right {acc}"


def run_cell(fed, recipe: str, seed: int, steps: int, eval_sets: dict, evaluate=None,
             contributor: dict | None = None) -> dict:
    """One (recipe, seed) cell from the initial weights; returns its record. With a rollout-only agent in
    ``fed`` (one at most) the cell is recipe ``<recipe>+contrib`` and also holds ``contributor`` (the record
    passed in, e.g. :meth:`contributor.Contributor.record`; ``{"name": …}`` without one), ``contributor_steps``
    (:func:`contributor_step`) and, per learner and step, ``contributor`` (:func:`contributor_rows`)."""
    if len(fed.contributors) > 1:
        raise ValueError(f"one rollout-only agent per cell, got {fed.contributors}")
    evaluate = evaluate or fed.evaluate
    fed.reset(algo={"name": recipe, **ALGO.get(recipe, {}), "kl_coef": 0.0}, optim={"seed": seed})
    t0 = time.perf_counter()
    results = fed.run(run_id=f"collab-s{seed}", steps=steps, seed=seed,
                      on_step=lambda r: print(_progress_line(recipe, seed, steps, r, time.perf_counter() - t0),
                                              flush=True))
    t1 = time.perf_counter()
    after, texts = evaluate_sets(fed, evaluate, eval_sets)
    t2 = time.perf_counter()
    agents = sorted(fed.learners)
    rec = {"recipe": recipe, "seed": seed, "steps": steps, "train_s": t1 - t0, "eval_s": t2 - t1,
           "after": {a: after[a] for a in agents},
           "per_step": {a: [_step_summary(a, s, fed.contributors) for s in results] for a in agents}}
    if texts:
        rec["responses"] = {a: texts[a] for a in agents}
    if fed.contributors:
        c = fed.contributors[0]
        rec["recipe"] = recipe + CONTRIB
        rec["contributor"] = contributor or {"name": c}
        rec["contributor_steps"] = [contributor_step(s, c) for s in results]
        for a in agents:
            for summary, s in zip(rec["per_step"][a], results, strict=True):
                summary["contributor"] = contributor_rows(s, a, c)
    return rec


def _refresh_page(out: Path) -> None:
    """docs/results.md's tables made from ``out``, rewritten from its cells (a failure is reported, the run goes on)."""
    from collab.page import refresh_page

    try:
        names = refresh_page(out)
    except (ValueError, OSError, KeyError) as err:
        print(f"warning: docs/results.md not rewritten: {type(err).__name__}: {err}", flush=True)
        return
    if names:
        print(f"docs/results.md: tables {', '.join(names)} rewritten from {out.name}'s cells", flush=True)


def run_benchmark(cfg, out: Path, meta: dict, recipes: list[str], seeds: int, steps: int, suite: bool,
                  contributor: dict | None) -> None:
    """Load the federation once, write ``meta.json`` and (once) ``before.json``, then run every missing cell,
    seed-major, each written to ``cells/`` and the summary and docs/results.md's tables made from ``out`` rebuilt
    after it."""
    from inproc import Federation

    fed = Federation(cfg)
    try:
        eval_sets, evaluate, tasks = eval_sets_for(fed, cfg, suite)
        if tasks is not None:
            meta["tasks"] = tasks
        meta["eval_sets"] = list(eval_sets)
        (out / "meta.json").write_text(json.dumps(meta, indent=1))
        before_path = out / "before.json"
        if not before_path.exists():
            before_path.write_text(json.dumps(evaluate_before(fed, evaluate, eval_sets), indent=1))
        suffix = CONTRIB if contributor else ""
        for seed in range(seeds):
            for recipe in recipes:
                cell = out / "cells" / f"{recipe}{suffix}-s{seed}.json"
                if cell.exists():
                    print(f"[{recipe}{suffix} s{seed}] done already", flush=True)
                    continue
                rec = run_cell(fed, recipe, seed, steps, eval_sets, evaluate, contributor)
                cell.write_text(json.dumps(rec, indent=1))
                accs = ", ".join(f"{a} {100 * accuracy(rec['after'][a]['held_out']):.1f} %" for a in sorted(rec["after"]))
                print(f"[{recipe}{suffix} s{seed}] {rec['train_s']:.0f} + {rec['eval_s']:.0f} s: {accs}", flush=True)
                summarize(out)
                _refresh_page(out)
    finally:
        fed.close()
