"""Collaboration benchmark: which recipe makes two heterogeneous agents better, paired over seeds and problems.

Recipes (all agents of a cell use the same one; equal rollout budget per prompt and agent, G =
``run.samples_per_prompt``; no KL term in any recipe):

* ``gspo``               — isolated: each agent trains on its own G;
* ``gspo_x2``            — isolated with 2G own rollouts (as many training rows as the sharing recipes);
* ``naive``              — the pooled rollouts, foreign rows used as if they were own;
* ``hacpo``              — the paper's HACPO (capability-aware advantages, ω, exponential IS, stepwise clip);
* ``hacpo_cross_family`` — HACPO with the cross ratio per byte of text, verified peer successes below the
  window kept at the edge weight and rows above it at weight 1 (docs/benchmarks.md "Cross-family collaboration");
* ``hacpo_cross_family_task`` — the same with ``algo.capability_scope = "task"`` (capability ratios per task).

Pairs (``--pair``): ``cross-family`` = ``examples/default.toml`` (SmolLM2-135M-Instruct + Gemma-3-270M);
``same-family`` = ``examples/same_family.toml`` (SmolLM2-135M-Instruct + a SmolLM2 checkpoint trained a few
steps further, the paper's heterogeneous-state setting; make the checkpoint first, see that file);
``tasks`` = ``examples/tasks.toml`` (the cross-family pair on the reasoning-gym task suite);
``episodes`` = ``examples/episodes.toml`` (multi-turn games); ``tiny``, ``tiny-tasks``, ``tiny-episodes`` = the
same on tiny local models (plumbing checks, not results). Ablations of ``tasks`` (``benchmarks/configs/``, not
examples): ``tasks-near-family`` holds ``basic_arithmetic`` out as a near family, ``tasks-families-trained`` trains
the two held-out families alone (docs/tasks.md, "What would move a held-out family").

On a task suite the evaluation sets are the held-out items of the trained tasks (``held_out``) and the held-out
task families (``families``); every problem's outcome is kept (``correct``, ``truncated``, ``no_answer``,
``wrong_answer``), so a gain is classified as format (before: truncated or no answer) or content (before: a
stated wrong answer), and results are given per task. The noise section states, from the isolated-GSPO cells,
the seed and evaluation standard deviations and the minimum detectable effect of a paired comparison.

Each (recipe, seed) cell runs in one process through :mod:`inproc` (the production worker and coordinator
code without the Flower transport; models loaded once, reset to their initial weights per cell). Evaluation:
greedy avg@1 on the held-out split of the training distribution (``--eval-size`` problems, the same for every
seed) and on the same problems in other words (:func:`hacrl_fed.data.arithmetic.reword`), reported apart.
The "before" evaluation is shared by every cell (greedy decoding of the same weights).

Resumable: every finished cell is written to ``<out>/cells/<recipe>-s<seed>.json`` (commit them as they come)
and skipped on the next run; cells run seed-major, so an interrupted benchmark leaves every recipe with the
same seeds. ``--summary-only`` rebuilds ``results.md`` / ``results.json`` / ``collab.png`` from the cells.

With a rollout-only contributor (``--contributor DIR_OR_URL``, docs/cross-vendor.md): every cell of the run has a
third site whose rollouts come from an OpenAI-compatible endpoint — a local model directory (an export with its
``hacrl_fed_prompt.json``) served by a ``transformers serve`` this script starts and stops (:mod:`contributor`),
or a URL with ``--contributor-api-model``. It generates each step, is validated, re-verified and counted in the
capability window by the coordinator's functions, its batch is pooled, and it never trains. Such cells are
recipe ``<recipe>+contrib`` (file ``<recipe>+contrib-s<seed>.json``, "… + contributor" in the tables) and record
the contributor (source, URL, model, prompt), its per-step acceptance and accuracy, and per learner and step the
contributor's rows that reached the learner's gradient (:func:`contributor_rows`). Run them into the directory
of the cells without a contributor: the summary pairs ``recipe+contrib`` with ``recipe`` by seed and problem.
``meta.json`` keeps the contributor; a directory never mixes two contributors (another source is refused).

    python benchmarks/run_collab.py --out benchmarks/results/collab-10step        # cross-family, 3 seeds × 10 steps
    python benchmarks/run_collab.py --pair same-family --out benchmarks/results/same-family-10step
    python benchmarks/run_collab.py --tiny --seeds 1 --steps 2 --out /tmp/collab-tiny   # plumbing check
    python benchmarks/run_collab.py --pair tasks --recipes hacpo_cross_family --contributor runs/<run>/smollm2/export \
        --out benchmarks/results/collab-tasks                                     # + a rollout-only site
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

RECIPES = ("gspo", "hacpo_cross_family", "hacpo", "naive", "gspo_x2", "hacpo_cross_family_task")
LABELS = {"gspo": "GSPO (isolated)", "gspo_x2": "GSPO×2 (isolated, 2G)", "naive": "naive sharing",
          "hacpo": "HACPO (paper)", "hacpo_cross_family": "HACPO cross-family",
          "hacpo_cross_family_task": "HACPO cross-family, capability per task"}
ALGO = {"hacpo_cross_family_task": {"name": "hacpo_cross_family", "capability_scope": "task"}}
"""Recipes that are a preset with options; every other recipe is the preset of its name."""
PAIRS = {"cross-family": "examples/default.toml", "same-family": "examples/same_family.toml",
         "tiny": "examples/tiny.toml", "tasks": "examples/tasks.toml", "tiny-tasks": "examples/tiny_tasks.toml",
         "episodes": "examples/episodes.toml", "tiny-episodes": "examples/tiny_episodes.toml",
         # ablations of tasks.toml, not examples
         "tasks-near-family": "benchmarks/configs/tasks_near_family.toml",
         "tasks-families-trained": "benchmarks/configs/tasks_families_trained.toml"}
"""Pair → base simulate config, relative to the repository root."""
EVAL_SETS = ("held_out", "words")
SET_TITLES = {"held_out": ("Held-out split (training wording)", "held-out", "held-out (training wording)"),
              "words": ("Other wording", "other wording", "other wording"),
              "families": ("Held-out task families (never trained)", "families", "held-out task families")}
COLLABORATIVE = ("hacpo_cross_family", "hacpo", "naive", "hacpo_cross_family_task")
PAIRWISE_BASES = ("hacpo", "gspo_x2")
"""Besides Δ vs GSPO, each collaborative recipe is compared with the paper's HACPO (does an extension add
anything?) and with GSPO×2 (is it the peer's rollouts or just their number?)."""
TWINS = {"hacpo_cross_family_task": "hacpo_cross_family"}
"""A named option's recipe → the same recipe without it (its difference isolates the option)."""
CONTRIB = "+contrib"
"""Suffix of a recipe whose cells had the rollout-only contributor (``--contributor``): ``hacpo+contrib``."""
CONTRIB_COUNTS = ("delivered", "rows", "no_logprob_rows", "grad_rows", "pos_adv_rows", "pos_adv_grad_rows",
                  "dropped_truncated", "screened_out")
"""The row counts of :func:`contributor_rows`, summed over steps and seeds in the summary."""


def base_recipe(recipe: str) -> str:
    """``hacpo+contrib`` → ``hacpo``; a recipe without the suffix is its own base."""
    return recipe.removesuffix(CONTRIB)


def label(recipe: str) -> str:
    """A recipe's name in the tables: its label, ``+ contributor`` for a cell with the rollout-only site."""
    base = base_recipe(recipe)
    return LABELS.get(base, base) + (" + contributor" if recipe != base else "")


def is_correct(value) -> bool:
    """A per-problem entry of a cell: ``True``/``False`` (arithmetic cells), an outcome string (task cells) or an
    episode's reward in [0, 1] (episode cells: won at 1)."""
    return value is True or value == "correct" or (isinstance(value, float) and value >= 1.0)


def reward_of(value) -> float:
    """An episode cell's entry, its reward in [0, 1] (a partial reward counts how close a lost episode came)."""
    return float(value)


def has_rewards(entries: dict) -> bool:
    """Whether a ``{problem id: entry}`` map holds episode rewards (floats), so a mean reward can be reported."""
    return bool(entries) and all(isinstance(v, float) for v in entries.values())


def mean_reward(entries: dict) -> float:
    """Mean episode reward of a ``{problem id: reward}`` map (nan when empty)."""
    return statistics.fmean(entries.values()) if entries else float("nan")


def accuracy(correct: dict, only: set[str] | None = None) -> float:
    """Share of problems answered correctly in a ``{problem id: correct or outcome}`` map, over ``only`` when
    given (nan when empty)."""
    vals = [is_correct(v) for p, v in correct.items() if only is None or p in only]
    return sum(vals) / len(vals) if vals else float("nan")


def _step_summary(agent: str, step, contributors=()) -> dict:
    """One learner's step in a cell; ``peers``: the other learners' per-source metrics (a rollout-only site in
    ``contributors`` is recorded apart, :func:`contributor_rows`)."""
    rep = step.reports.get(agent, {"metrics": {}, "per_source": {}})
    peers = {src: {k: m.get(k) for k in ("rows", "grad_frac", "s_mean", "s_min", "s_max", "clip_low", "clip_high",
                                          "pos_adv_rows", "pos_adv_grad_rows", "dropped_truncated")}
             for src, m in rep["per_source"].items() if src != agent and src not in contributors}
    own = rep["per_source"].get(agent, {})
    gen = step.generate_metrics.get(agent, {})
    return {"step": step.step, "accuracy": step.accuracy.get(agent), "stop_frac": gen.get("stop_frac"),
            "generate_s": step.generate_s.get(agent), "train_s": step.train_s.get(agent),
            "own_grad_frac": own.get("grad_frac"), "updates": rep["metrics"].get("updates"),
            "zero_grad_updates": rep["metrics"].get("zero_grad_updates"), "peers": peers,
            **({"turns_mean": gen["episode/turns_mean"], "done_frac": gen.get("episode/done_frac")}
               if "episode/turns_mean" in gen else {})}


def own_gradient(cells: list[dict], agent: str) -> dict | None:
    """How much of ``agent``'s own training carried a gradient over ``cells`` (one recipe, any seeds), from the
    per-step records of :func:`_step_summary`: ``rollout_accuracy`` (mean share of its rollouts verified right),
    ``own_grad_frac`` (mean share of its own rows whose term in the loss had a gradient, the worker's
    ``src/<own>/grad_frac``) and ``updates_with_grad`` / ``updates`` (optimizer updates whose gradient was not zero,
    summed over steps and seeds). ``None`` when no step recorded them. A group whose rewards are all equal has
    advantage 0 (``hacrl_fed.algo.advantages.group_advantages``), so a learner that never sees a success, alone
    or in a joint group, has nothing to learn from. On episodes ``rollout_accuracy`` is the mean episode reward
    (P_t, partial rewards included); the cells that recorded the worker's episode metrics also give
    ``turns_mean`` (agent turns per training episode, ``episode/turns_mean``), ``done_frac`` (share ended by the
    environment, not by ``max_turns`` or the token budget) and ``turns_cells`` (how many cells recorded them).
    """
    steps = [s for c in cells for s in c["per_step"][agent] if s.get("own_grad_frac") is not None]
    if not steps:
        return None
    updates = sum(s.get("updates") or 0 for s in steps)
    out = {"rollout_accuracy": statistics.fmean(s["accuracy"] or 0.0 for s in steps),
           "own_grad_frac": statistics.fmean(s["own_grad_frac"] for s in steps),
           "updates": updates, "updates_with_grad": updates - sum(s.get("zero_grad_updates") or 0 for s in steps)}
    played = [s for s in steps if s.get("turns_mean") is not None]
    if played:
        out["turns_mean"] = statistics.fmean(s["turns_mean"] for s in played)
        out["done_frac"] = statistics.fmean(s.get("done_frac") or 0.0 for s in played)
        out["turns_cells"] = sum(any(s.get("turns_mean") is not None for s in c["per_step"][agent]) for c in cells)
    return out


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
      over the epochs.
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
            "pos_adv_grad_rows": m.get("pos_adv_grad_rows", 0.0)}


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


def paired_interval(cells_a: list[dict], cells_b: list[dict], agent: str, eval_set: str, *,
                    reps: int = 2000, seed: int = 0, only: set[str] | None = None,
                    value=is_correct) -> tuple[float, float, float]:
    """Mean and 95 % bootstrap interval of accuracy(a) − accuracy(b), paired by seed and problem (over the
    problems in ``only`` when given); ``value=reward_of`` compares the mean episode reward instead.

    Seeds present in both and problems present in both are paired; the bootstrap resamples seeds, then
    problems (two-level), so both the training randomness and the problem sample count. Returns
    ``(mean, low, high)`` in accuracy units (nan when nothing pairs).
    """
    by_a = {c["seed"]: c["after"][agent][eval_set] for c in cells_a}
    by_b = {c["seed"]: c["after"][agent][eval_set] for c in cells_b}
    seeds = sorted(set(by_a) & set(by_b))
    if not seeds:
        return float("nan"), float("nan"), float("nan")
    common = set.intersection(*(set(by_a[s]) & set(by_b[s]) for s in seeds))
    problems = sorted(common & only if only else common)
    if not problems:
        return float("nan"), float("nan"), float("nan")
    diff = {s: [float(value(by_a[s][p])) - float(value(by_b[s][p])) for p in problems] for s in seeds}
    mean = statistics.fmean(x for s in seeds for x in diff[s])
    rng = random.Random(seed)
    boots = []
    for _ in range(reps):
        ss = [rng.choice(seeds) for _ in seeds]
        idx = [rng.randrange(len(problems)) for _ in problems]
        boots.append(statistics.fmean(diff[s][i] for s in ss for i in idx))
    boots.sort()
    return mean, boots[int(0.025 * reps)], boots[int(0.975 * reps) - 1]


def eval_sets_of(meta: dict) -> tuple[str, ...]:
    """The evaluation sets of a benchmark directory (older ones: held-out + other wording)."""
    return tuple(meta.get("eval_sets") or EVAL_SETS)


def noise(cells: list[dict], agent: str, eval_set: str) -> dict:
    """Noise of one recipe's accuracy for one agent (``cells``: its seeds): ``sd_between``, the standard deviation
    of the accuracy over seeds as observed; ``sd_eval``, the evaluation (binomial) standard deviation of one cell
    with n problems; ``sd_seed``, the larger of the two (a seed's accuracy holds its evaluation noise, so two
    seeds that happen to agree do not make the design noiseless); and the minimum detectable effect (80 % power,
    two-sided 5 %) of a difference between two recipes with as many seeds, paired by seed and problem:
    MDE = (z_0.975 + z_0.8) · √2 · sd_seed / √S. ``seeds_for_5_points`` solves the same formula for S at
    MDE = 0.05. All are fractions (0.05 = 5 points)."""
    xs = [accuracy(c["after"][agent][eval_set]) for c in cells]
    n = len(cells[0]["after"][agent][eval_set]) if cells else 0
    if len(xs) < 2 or not n:
        return {"seeds": len(xs), "problems": n, "sd_between": None, "sd_seed": None, "sd_eval": None,
                "mde": None, "seeds_for_5_points": None}
    p = statistics.fmean(xs)
    sd_eval = math.sqrt(max(p * (1 - p), 1e-12) / n)
    sd_between = statistics.stdev(xs)
    sd_seed = max(sd_between, sd_eval)
    return {"seeds": len(xs), "problems": n, "sd_between": sd_between, "sd_seed": sd_seed, "sd_eval": sd_eval,
            "mde": (1.96 + 0.8416) * math.sqrt(2) * sd_seed / math.sqrt(len(xs)),
            "seeds_for_5_points": math.ceil(((1.96 + 0.8416) * math.sqrt(2) * sd_seed / 0.05) ** 2)}


def paired_mde(cells_a: list[dict], cells_b: list[dict], agent: str, eval_set: str) -> dict:
    """The minimum detectable effect of recipe a − recipe b as observed: the sd over seeds of the per-seed
    accuracy difference (same seed, same problems), sd_d, and MDE = (z_0.975 + z_0.8) · sd_d / √S (80 % power,
    two-sided 5 %), with the seeds that would detect 5 points. Unlike :func:`noise` this counts what pairing
    by seed removes (a hard seed is hard for both recipes). ``None`` values below 2 paired seeds."""
    by_a = {c["seed"]: accuracy(c["after"][agent][eval_set]) for c in cells_a}
    by_b = {c["seed"]: accuracy(c["after"][agent][eval_set]) for c in cells_b}
    diffs = [by_a[s] - by_b[s] for s in sorted(set(by_a) & set(by_b))]
    if len(diffs) < 2:
        return {"seeds": len(diffs), "sd_diff": None, "mde": None, "seeds_for_5_points": None}
    sd = statistics.stdev(diffs)
    return {"seeds": len(diffs), "sd_diff": sd, "mde": (1.96 + 0.8416) * sd / math.sqrt(len(diffs)),
            "seeds_for_5_points": max(2, math.ceil(((1.96 + 0.8416) * sd / 0.05) ** 2))}


def gain_kinds(before: dict, after: dict) -> dict:
    """Problems wrong before and right after, by what was wrong before: ``format`` (truncated or no stated
    answer) or ``content`` (a stated wrong answer, or a verifier error); and problems right before, wrong after,
    by what went wrong after. Needs outcome strings (task cells); ``{}`` for arithmetic cells (booleans)."""
    if not all(isinstance(v, str) for v in [*before.values(), *after.values()]):
        return {}
    out = {"format_fixed": 0, "content_fixed": 0, "format_broken": 0, "content_broken": 0}
    for pid, b in before.items():
        a = after.get(pid)
        if a is None or is_correct(a) == is_correct(b):
            continue
        kind = "format" if (a if is_correct(b) else b) in ("truncated", "no_answer") else "content"
        out[f"{kind}_{'fixed' if is_correct(a) else 'broken'}"] += 1
    return out


OUTCOMES = ("correct", "wrong_answer", "truncated", "no_answer", "verifier_error")
"""What an evaluated response can be (``Federation.evaluate_outcomes``): right; a stated wrong answer; cut at the
token limit; no stated answer; the verifier failed."""


def outcome_mix(outcomes: dict, only: set[str] | None = None) -> dict[str, float] | None:
    """Share of the problems (those in ``only`` when given) of each :data:`OUTCOMES` value, in [0, 1]; None for
    cells without outcome strings (arithmetic cells hold booleans) or without a problem."""
    xs = [v for p, v in outcomes.items() if only is None or p in only]
    if not xs or not all(isinstance(v, str) for v in xs):
        return None
    return {k: sum(v == k for v in xs) / len(xs) for k in OUTCOMES}


def contributor_summary(cells: list[dict], agent: str) -> dict:
    """The contributor's rows in ``agent``'s updates over the cells of one ``+contrib`` recipe: every count of
    :func:`contributor_rows` summed over steps and seeds; ``share`` = grad_rows / delivered (the share of the
    contributor's pooled rows that reached this learner's gradient), ``in_update_share`` = rows / delivered
    (that entered its update at all), ``grad_share_of_rows`` = grad_rows / rows; ``share_per_step``: the share at
    step i over the seeds. Shares are None where their denominator is 0."""
    steps = [s["contributor"] for c in cells for s in c["per_step"][agent] if "contributor" in s]
    tot = {k: float(sum(s.get(k) or 0.0 for s in steps)) for k in CONTRIB_COUNTS}

    def ratio(num: float, den: float):
        return num / den if den else None

    n_steps = min((len(c["per_step"][agent]) for c in cells), default=0)
    per_step = []
    for i in range(n_steps):
        at = [c["per_step"][agent][i].get("contributor") or {} for c in cells]
        per_step.append(ratio(sum(x.get("grad_rows") or 0.0 for x in at), sum(x.get("delivered") or 0.0 for x in at)))
    left_out = sum(bool(s.get("rejected_by_learner")) for s in steps)
    return tot | {"steps": len(steps), "rejected_by_learner_steps": left_out,
                  "share": ratio(tot["grad_rows"], tot["delivered"]),
                  "in_update_share": ratio(tot["rows"], tot["delivered"]),
                  "grad_share_of_rows": ratio(tot["grad_rows"], tot["rows"]), "share_per_step": per_step}


def contributor_site(cells: list[dict]) -> dict:
    """The rollout-only site over the cells of one ``+contrib`` recipe: its record (from the first cell), the
    steps it was pooled / not, its mean coordinator-verified accuracy over pooled steps, seconds per step."""
    steps = [s for c in cells for s in c.get("contributor_steps", [])]
    acc = [s["accuracy"] for s in steps if s.get("accepted") and s.get("accuracy") is not None]
    gen = [s["generate_s"] for s in steps if s.get("generate_s") is not None]
    return {"record": cells[0].get("contributor", {}), "steps": len(steps),
            "accepted_steps": sum(bool(s.get("accepted")) for s in steps),
            "accuracy_mean": statistics.fmean(acc) if acc else None,
            "generate_s_per_step": statistics.fmean(gen) if gen else None,
            "not_pooled": sorted({s["rejected"] for s in steps if s.get("rejected")})[:5]}


def summarize(out: Path) -> dict:
    before = json.loads((out / "before.json").read_text())
    cells = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]
    meta = json.loads((out / "meta.json").read_text())
    sets = eval_sets_of(meta)
    tasks_of: dict[str, str] = meta.get("tasks") or {}
    task_names = sorted(set(tasks_of.values()))
    agents = sorted(before["agents"])
    recipes = [r for b in RECIPES for r in (b, b + CONTRIB) if any(c["recipe"] == r for c in cells)]
    by = {r: sorted((c for c in cells if c["recipe"] == r), key=lambda c: c["seed"]) for r in recipes}
    summary: dict = {"meta": meta, "before": {a: {e: accuracy(before["agents"][a][e]) for e in sets} for a in agents},
                     "recipes": {}}
    if all(has_rewards(before["agents"][a][e]) for a in agents for e in sets):   # episodes
        summary["before_reward"] = {a: {e: mean_reward(before["agents"][a][e]) for e in sets} for a in agents}
    ids_of = {t: {p for p, x in tasks_of.items() if x == t} for t in task_names}   # task → its problem ids
    if task_names:
        merged = {a: {**before["agents"][a].get("held_out", {}), **before["agents"][a].get("families", {})}
                  for a in agents}
        summary["before_tasks"] = {a: {t: accuracy(merged[a], ids_of[t]) for t in task_names} for a in agents}
        summary["before_outcomes"] = {a: {t: outcome_mix(merged[a], ids_of[t]) for t in task_names} for a in agents}
    if "gspo" in by:
        summary["noise"] = {a: {e: noise(by["gspo"], a, e) for e in sets} for a in agents}
    for r in recipes:
        rec: dict = {"seeds": [c["seed"] for c in by[r]], "agents": {}}
        for a in agents:
            ag: dict = {}
            for e in sets:
                xs = [accuracy(c["after"][a][e]) for c in by[r]]
                ag[e] = {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
                         "n": len(xs), "per_seed": xs}
                if r != "gspo" and "gspo" in by:
                    ag[e]["vs_gspo"] = paired_interval(by[r], by["gspo"], a, e)
                    ag[e]["mde_vs_gspo"] = paired_mde(by[r], by["gspo"], a, e)
                if r in COLLABORATIVE:
                    ag[e]["vs"] = {b: paired_interval(by[r], by[b], a, e) for b in (*PAIRWISE_BASES, TWINS.get(r))
                                   if b in by and b != r}
                if base_recipe(r) != r and base_recipe(r) in by:
                    ag[e]["vs_without_contrib"] = paired_interval(by[r], by[base_recipe(r)], a, e)
                    ag[e]["mde_vs_without_contrib"] = paired_mde(by[r], by[base_recipe(r)], a, e)
                if all(has_rewards(c["after"][a][e]) for c in by[r]):
                    xs = [mean_reward(c["after"][a][e]) for c in by[r]]
                    ag[e]["reward"] = {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1
                                       else 0.0, "n": len(xs), "per_seed": xs}
                    if r != "gspo" and "gspo" in by:
                        ag[e]["reward"]["vs_gspo"] = paired_interval(by[r], by["gspo"], a, e, value=reward_of)
                kinds = [gain_kinds(before["agents"][a][e], c["after"][a][e]) for c in by[r]]
                if all(kinds):
                    ag[e]["gains"] = {k: statistics.fmean(x[k] for x in kinds) for k in kinds[0]}
            if task_names:
                ag["tasks"] = {}
                for t in task_names:
                    only = ids_of[t]
                    e = next(e for e in sets if only & set(by[r][0]["after"][a][e]))
                    xs = [accuracy(c["after"][a][e], only) for c in by[r]]
                    mixes = [outcome_mix(c["after"][a][e], only) for c in by[r]]
                    ag["tasks"][t] = {"set": e, "mean": statistics.fmean(xs), "per_seed": xs,
                                      "outcomes": {k: statistics.fmean(m[k] for m in mixes) for k in OUTCOMES}
                                      if all(mixes) else None,
                                      "vs_gspo": paired_interval(by[r], by["gspo"], a, e, only=only)
                                      if r != "gspo" and "gspo" in by else None,
                                      "vs_gspo_x2": paired_interval(by[r], by["gspo_x2"], a, e, only=only)
                                      if r not in ("gspo_x2",) and "gspo_x2" in by else None}
                    if base_recipe(r) != r:
                        base = by.get(base_recipe(r))
                        ag["tasks"][t]["vs_without_contrib"] = (paired_interval(by[r], base, a, e, only=only)
                                                                if base else None)
            ag["own_gradient"] = own_gradient(by[r], a)
            peers = [v for c in by[r] for s in c["per_step"][a] for v in s["peers"].values()]
            ag["peer_grad_frac"] = statistics.fmean(p["grad_frac"] for p in peers if p.get("grad_frac") is not None) \
                if any(p.get("grad_frac") is not None for p in peers) else None
            pos = sum(p.get("pos_adv_rows") or 0 for p in peers)
            ag["peer_success_grad_frac"] = (sum(p.get("pos_adv_grad_rows") or 0 for p in peers) / pos) if pos else None
            ag["grad_frac_per_step"] = [
                statistics.fmean(v["grad_frac"] for c in by[r] for v in c["per_step"][a][i]["peers"].values()
                                 if v.get("grad_frac") is not None)
                if any(v.get("grad_frac") is not None for c in by[r] for v in c["per_step"][a][i]["peers"].values())
                else None for i in range(min(len(c["per_step"][a]) for c in by[r]))]
            ag["generate_s_per_step"] = statistics.fmean(s["generate_s"] for c in by[r] for s in c["per_step"][a])
            ag["train_s_per_step"] = statistics.fmean(s["train_s"] or 0.0 for c in by[r] for s in c["per_step"][a])
            if base_recipe(r) != r:
                ag["contributor"] = contributor_summary(by[r], a)
            rec["agents"][a] = ag
        rec["cell_s"] = statistics.fmean(c["train_s"] + c["eval_s"] for c in by[r])
        rec["steps_s"] = statistics.fmean(c["train_s"] for c in by[r])
        rec["eval_s"] = statistics.fmean(c["eval_s"] for c in by[r])
        if base_recipe(r) != r:
            rec["contributor"] = contributor_site(by[r])
        summary["recipes"][r] = rec
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    (out / "results.md").write_text(render_markdown(summary, agents))
    try:
        plot(summary, agents, out / "collab.png")
    except ImportError:
        pass
    return summary


def _pm(s: dict) -> str:
    return f"{100 * s['mean']:.1f} ± {100 * s['std']:.1f}" if s["n"] > 1 else f"{100 * s['mean']:.1f}"


def _ci(t) -> str:
    if t is None:
        return "—"
    m, lo, hi = t
    return f"{100 * m:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def _own_gradient_markdown(summary: dict, agents: list[str]) -> list[str]:
    """The table of :func:`own_gradient` per recipe and agent (empty when no cell recorded it)."""
    if not any(rec["agents"][a].get("own_gradient") for rec in summary["recipes"].values() for a in agents):
        return []
    episodes = "before_reward" in summary
    right = "mean rollout reward" if episodes else "rollouts right"
    lines = ["## Own rows that carried a gradient", "",
             "Over the training steps, mean over seeds: " + (
                 "the agent's mean episode reward (×100, partial rewards included)" if episodes else
                 "the share of the agent's rollouts verified right") + ", the share of its own rows whose loss term "
             "had a gradient (a group whose rewards are all equal has advantage 0), and the optimizer updates with a "
             "non-zero gradient.", "",
             "| recipe | " + " | ".join(f"{a}: {right} / own rows with a gradient / updates with a gradient"
                                       for a in agents) + " |", "|---|" + "---|" * len(agents)]
    for r, rec in summary["recipes"].items():
        cells = []
        for a in agents:
            g = rec["agents"][a].get("own_gradient")
            cells.append("–" if g is None else f"{100 * g['rollout_accuracy']:.1f}{'' if episodes else ' %'} / "
                         f"{100 * g['own_grad_frac']:.1f} % / {g['updates_with_grad']:.0f} of {g['updates']:.0f}")
        lines.append(f"| {label(r)} | " + " | ".join(cells) + " |")
    return lines + [""] + _turns_markdown(summary, agents)


def _turns_markdown(summary: dict, agents: list[str]) -> list[str]:
    """Episode cells: agent turns per training episode and the share the environment ended (:func:`own_gradient`);
    empty when no cell recorded them."""
    grads = {(r, a): rec["agents"][a].get("own_gradient") or {} for r, rec in summary["recipes"].items()
             for a in agents}
    if not any("turns_mean" in g for g in grads.values()):
        return []
    lines = ["## Turns per episode in training", "",
             "Agent turns per training episode and the share of episodes the game ended (the rest stopped at "
             "`max_turns` or the token budget), mean over steps and the seeds that recorded them.", "",
             "| recipe | seeds recorded | " + " | ".join(f"{a}: turns / ended by the game" for a in agents) + " |",
             "|---|---|" + "---|" * len(agents)]
    for r, rec in summary["recipes"].items():
        g = [grads[r, a] for a in agents]
        cells = ["–" if "turns_mean" not in x else f"{x['turns_mean']:.1f} / {100 * x['done_frac']:.0f} %" for x in g]
        seeds = max((x.get("turns_cells", 0) for x in g), default=0)
        lines.append(f"| {label(r)} | {seeds} of {len(rec['seeds'])} | " + " | ".join(cells) + " |")
    return lines + [""]


def _pairwise_markdown(summary: dict, agents: list[str]) -> list[str]:
    """The collaborative recipes against the paper's HACPO and GSPO×2 (mean [95 % interval], paired)."""
    sets = eval_sets_of(summary["meta"])
    rows = [(r, b, rec) for r, rec in summary["recipes"].items() for b in (*PAIRWISE_BASES, TWINS.get(r))
            if b in rec["agents"][agents[0]][sets[0]].get("vs", {})]
    if not rows:
        return []
    lines = ["## Collaborative recipes against the paper's HACPO and GSPO×2", "",
             "Difference in points, mean [95 % interval], paired by seed and problem as above; a named option also "
             "against the same recipe without it (capability per task − global capability).", "",
             "| recipe − baseline | " + " | ".join(f"{a} {SET_TITLES[e][1]}" for a in agents for e in sets)
             + " |", "|---|" + "---|" * (len(sets) * len(agents))]
    for r, b, rec in rows:
        lines.append(f"| {label(r)} − {label(b)} | " + " | ".join(
            _ci(rec["agents"][a][e]["vs"][b]) for a in agents for e in sets) + " |")
    return lines + [""]


def _reward_markdown(summary: dict, agents: list[str]) -> list[str]:
    """Episode cells: the mean reward of the held-out episodes (a win is 1, a lost episode its partial reward),
    which moves before the win rate does; empty for other cells."""
    if "before_reward" not in summary:
        return []
    lines = []
    for e in eval_sets_of(summary["meta"]):
        lines += [f"## Mean episode reward, {SET_TITLES[e][1]}", "",
                  "Greedy, one episode per instance: a win is 1, a lost episode scores its partial reward; mean over "
                  "instances, ×100, mean ± std over seeds; Δ vs GSPO paired by seed and instance.", ""]
        lines += _recipe_table(summary, agents, {a: summary["before_reward"][a][e] for a in agents},
                               lambda rec, a, e=e: rec["agents"][a][e].get("reward"))
    return lines


def _recipe_table(summary: dict, agents: list[str], before: dict, stat) -> list[str]:
    """A table of recipes × agents: after (mean ± std over seeds) and Δ vs GSPO, below the ``before`` row (agent →
    value); ``stat(recipe record, agent)`` gives a recipe's figures (``mean``, ``std``, ``n``, ``vs_gspo``), or
    None (shown as –)."""
    lines = ["| recipe | seeds | " + " | ".join(f"{a} after | {a} Δ vs GSPO" for a in agents) + " |",
             "|---|---|" + "---|---|" * len(agents),
             "| before training | – | " + " | ".join(f"{100 * before[a]:.1f} | " for a in agents) + " |"]
    for r, rec in summary["recipes"].items():
        cells = []
        for a in agents:
            s = stat(rec, a)
            cells += ["–", "—"] if s is None else [_pm(s), _ci(s.get("vs_gspo"))]
        lines.append(f"| {label(r)} | {len(rec['seeds'])} | " + " | ".join(cells) + " |")
    return lines + [""]


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f} %"


def _contrib_markdown(summary: dict, agents: list[str]) -> list[str]:
    """The ``+contrib`` recipes: Δ against the same recipe without the contributor (paired by seed and problem),
    the contributor itself, and the share of its rows that reached each learner's gradient."""
    rows = [(r, rec) for r, rec in summary["recipes"].items() if "contributor" in rec]
    if not rows:
        return []
    sets = eval_sets_of(summary["meta"])
    site = summary["meta"].get("contributor") or rows[0][1]["contributor"]["record"]
    lines = ["## With a rollout-only contributor", "",
             f"A third site, `{site.get('name')}`, generated every step from an OpenAI-compatible endpoint "
             f"(source `{site.get('source')}`, model `{site.get('api_model')}`; prompt from "
             f"`{site.get('prompt_from')}`): validated, re-verified and counted in the capability window like any "
             "site, its batch pooled, never trained. Δ: recipe + contributor − the same recipe without it, points, "
             "mean [95 % interval], paired by seed and problem."]
    if site.get("command"):
        lines += ["", f"Command: `{site['command']}`"]
    lines += ["", "| recipe + contributor − recipe | "
              + " | ".join(f"{a} {SET_TITLES[e][1]}" for a in agents for e in sets) + " |",
              "|---|" + "---|" * (len(sets) * len(agents))]
    for r, rec in rows:
        lines.append(f"| {label(r)} − {label(base_recipe(r))} | " + " | ".join(
            _ci(rec["agents"][a][e].get("vs_without_contrib")) for a in agents for e in sets) + " |")
    lines += ["", "The contributor per cell: steps its batch was pooled, its coordinator-verified accuracy (mean over "
              "pooled steps), generation seconds per step; per learner, of the contributor's pooled rows (summed over "
              "steps and seeds): the share that entered the learner's update and the share that reached its gradient "
              "(`contributor_rows()` in this script says what counts).", "",
              "| recipe | pooled steps | contributor accuracy | s / step | "
              + " | ".join(f"{a}: in update / reached gradient (rows with a gradient of rows pooled)" for a in agents)
              + " |",
              "|---|---|---|---|" + "---|" * len(agents)]
    for r, rec in rows:
        c = rec["contributor"]
        acc, gen = c["accuracy_mean"], c["generate_s_per_step"]
        cells = [f"{_pct(x['in_update_share'])} / {_pct(x['share'])} ({x['grad_rows']:.0f} of {x['delivered']:.0f})"
                 for x in (rec["agents"][a]["contributor"] for a in agents)]
        lines.append(f"| {label(r)} | {c['accepted_steps']} / {c['steps']} | "
                     f"{'–' if acc is None else f'{100 * acc:.1f} %'} | {'–' if gen is None else f'{gen:.0f}'} | "
                     + " | ".join(cells) + " |")
    return lines + [""]


def _noise_markdown(summary: dict, agents: list[str]) -> list[str]:
    if "noise" not in summary:
        return []
    sets = eval_sets_of(summary["meta"])
    lines = ["## Noise and minimum detectable effect (isolated GSPO)", "",
             "The sd of a cell's accuracy between seeds, the evaluation (binomial) sd of one cell, the larger of "
             "the two (which the design uses: a seed's accuracy holds its evaluation noise), and the smallest "
             "difference between two recipes this design detects with 80 % power at two-sided 5 % "
             "(paired by seed and problem; `noise()` in this script), points, and the seeds per recipe that "
             "would detect 5 points.", "",
             "| agent | set | seeds | problems | sd between seeds | sd evaluation | sd used | "
             "minimum detectable effect | seeds for 5 points |",
             "|---|---|---|---|---|---|---|---|---|"]
    for a in agents:
        for e in sets:
            n = summary["noise"][a][e]
            f = (lambda x: "–" if x is None else f"{100 * x:.1f}")
            lines.append(f"| {a} | {SET_TITLES[e][1]} | {n['seeds']} | {n['problems']} | "
                         f"{f(n.get('sd_between'))} | {f(n['sd_eval'])} | {f(n['sd_seed'])} | {f(n['mde'])} | "
                         f"{n.get('seeds_for_5_points') or '–'} |")
    observed = [(r, a, e, rec["agents"][a][e]["mde_vs_gspo"]) for r, rec in summary["recipes"].items()
                for a in agents for e in sets if (rec["agents"][a][e].get("mde_vs_gspo") or {}).get("mde") is not None]
    if observed:
        lines += ["", "As observed, paired by seed (`paired_mde()`): the sd over seeds of the accuracy difference "
                  "recipe − GSPO and the effect it detects.", "",
                  "| recipe | agent | set | seeds | sd of the difference | minimum detectable effect | "
                  "seeds for 5 points |", "|---|---|---|---|---|---|---|"]
        for r, a, e, m in observed:
            lines.append(f"| {label(r)} | {a} | {SET_TITLES[e][1]} | {m['seeds']} | {100 * m['sd_diff']:.1f} | "
                         f"{100 * m['mde']:.1f} | {m['seeds_for_5_points']} |")
    return lines + [""]


def mechanism(summary: dict, agents: list[str]) -> dict:
    """Per collaborative recipe and agent: the tasks where the peer's accuracy before training is higher, the
    mean Δ vs GSPO there, and the same for the other tasks (the paper's claim: a learner gains from a peer where
    the peer is more capable). A plain mean over tasks; ``{}`` without per-task results or GSPO cells."""
    if "before_tasks" not in summary or "gspo" not in summary["recipes"] or len(agents) != 2:
        return {}
    out = {}
    for r, rec in summary["recipes"].items():
        if r not in COLLABORATIVE:
            continue
        for a in agents:
            peer = next(b for b in agents if b != a)
            tasks = rec["agents"][a]["tasks"]
            stronger = [t for t in tasks if summary["before_tasks"][peer][t] > summary["before_tasks"][a][t]]
            other = [t for t in tasks if t not in stronger]

            def mean_delta(ts):
                ds = [tasks[t]["vs_gspo"][0] for t in ts if tasks[t].get("vs_gspo")]
                return statistics.fmean(ds) if ds else None

            out[(r, a)] = {"stronger": stronger, "other": other, "stronger_delta": mean_delta(stronger),
                           "other_delta": mean_delta(other)}
    return out


def _family_tasks(summary: dict, agents: list[str], tasks: list[str]) -> list[str]:
    """The tasks of ``tasks`` that are held-out task families (evaluated, never trained)."""
    recipes = summary["recipes"]
    first = recipes[next(iter(recipes))]["agents"][agents[0]]["tasks"] if recipes else {}
    return [t for t in tasks if t in first and first[t]["set"] == "families"]


def _tasks_markdown(summary: dict, agents: list[str]) -> list[str]:
    if "before_tasks" not in summary:
        return []
    tasks = sorted(summary["before_tasks"][agents[0]])
    fams = _family_tasks(summary, agents, tasks)
    lines = ["## Per task", "",
             "Greedy accuracy after training, %, mean over seeds (before training in the first row); Δ vs GSPO "
             "paired by seed and problem. Task families only evaluated are marked *(held out)*. A peer is "
             "*stronger* on a task when its accuracy before training is higher: the paper's mechanism predicts the "
             "largest gain over isolated training there.", "",
             "| recipe | " + " | ".join(f"{a}: {t}" + (" *(held out)*" if t in fams else "")
                                       for a in agents for t in tasks) + " |",
             "|---|" + "---|" * (len(agents) * len(tasks))]
    peer = {a: next((b for b in agents if b != a), None) for a in agents}
    lines.append("| before training (peer stronger?) | " + " | ".join(
        f"{100 * summary['before_tasks'][a][t]:.1f}"
        + ("" if peer[a] is None else (" (yes)" if summary["before_tasks"][peer[a]][t] > summary["before_tasks"][a][t]
                                       else " (no)"))
        for a in agents for t in tasks) + " |")
    for r, rec in summary["recipes"].items():
        cells = []
        for a in agents:
            for t in tasks:
                x = rec["agents"][a]["tasks"][t]
                cells.append(f"{100 * x['mean']:.1f}" + (f" {_ci(x['vs_gspo'])}" if x.get("vs_gspo") else ""))
        lines.append(f"| {label(r)} | " + " | ".join(cells) + " |")
    lines += [""]
    mech = mechanism(summary, agents)
    if mech:
        lines += ["## Does an agent gain most where its peer is stronger?", "",
                  "Mean over the tasks of Δ vs GSPO (points; each task's Δ paired by seed and problem) on the tasks where the peer started "
                  "stronger, and on the others.", "",
                  "| recipe | agent | peer stronger: tasks | Δ vs GSPO | peer not stronger: tasks | Δ vs GSPO |",
                  "|---|---|---|---|---|---|"]
        for (r, a), m in mech.items():
            f = (lambda x: "–" if x is None else f"{100 * x:+.1f}")
            lines.append(f"| {label(r)} | {a} | {', '.join(m['stronger']) or '–'} | {f(m['stronger_delta'])} | "
                         f"{', '.join(m['other']) or '–'} | {f(m['other_delta'])} |")
        lines += [""]
    rows = [(r, rec) for r, rec in summary["recipes"].items()
            if any("gains" in rec["agents"][a][e] for a in agents for e in eval_sets_of(summary["meta"]))]
    if rows:
        lines += ["## Format or content", "",
                  "Problems per cell (mean over seeds) that turned right, by what was wrong before training "
                  "(format: cut at the token limit or no stated answer; content: a stated wrong answer), and that "
                  "turned wrong, by what was wrong after.", "",
                  "| recipe | agent | set | format fixed | content fixed | format broken | content broken |",
                  "|---|---|---|---|---|---|---|"]
        for r, rec in rows:
            for a in agents:
                for e in eval_sets_of(summary["meta"]):
                    g = rec["agents"][a][e].get("gains")
                    if g:
                        lines.append(f"| {label(r)} | {a} | {SET_TITLES[e][1]} | {g['format_fixed']:.1f} | "
                                     f"{g['content_fixed']:.1f} | {g['format_broken']:.1f} | {g['content_broken']:.1f} |")
        lines += [""]
    return lines + _family_outcomes_markdown(summary, agents, fams)


def _family_outcomes_markdown(summary: dict, agents: list[str], fams: list[str]) -> list[str]:
    """What the answers on each held-out task family (``fams``) are, before and after each recipe: a family can
    stay at 0 % because the model learned nothing there, or because it learned the answer format but not the
    skill."""
    recipes = summary["recipes"]
    if not fams or not all(summary["before_outcomes"][a][t] for a in agents for t in fams):
        return []
    lines = ["## Outcomes on the held-out task families", "",
             "Share of the family's problems, %, mean over seeds: right / a stated wrong answer / cut at the token "
             "limit / no stated answer. A family that stays near 0 % with its wrong answers now *stated* learned "
             "the answer format from the trained tasks, not the skill.", "",
             "| recipe | " + " | ".join(f"{a}: {t}" for a in agents for t in fams) + " |",
             "|---|" + "---|" * (len(agents) * len(fams))]
    fmt = (lambda m: " / ".join(f"{100 * m[k]:.0f}" for k in OUTCOMES[:4]))
    lines.append("| before training | " + " | ".join(fmt(summary["before_outcomes"][a][t])
                                                    for a in agents for t in fams) + " |")
    for r, rec in recipes.items():
        mixes = [rec["agents"][a]["tasks"][t].get("outcomes") for a in agents for t in fams]
        if all(mixes):
            lines.append(f"| {label(r)} | " + " | ".join(fmt(m) for m in mixes) + " |")
    return lines + [""]


def render_markdown(summary: dict, agents: list[str]) -> str:
    meta = summary["meta"]
    sets = eval_sets_of(meta)
    held = (f"held-out: {meta['eval_size']} problems of the training distribution and the same problems in other "
            "words" if "words" in sets else
            f"held-out: {meta['eval_size']} instances of every environment, one episode each (won: reward 1)"
            if "before_reward" in summary else
            f"held-out: {meta['eval_size']} items of every trained task, and as many of every held-out task family")
    lines = ["# Collaboration benchmark", "", f"Command: `{meta['command']}`", "",
             f"Pair: {meta['pair']} ({', '.join(f'{a} = {m}' for a, m in meta['models'].items())}); "
             f"{meta['steps']} steps of B = {meta['prompts_per_step']} prompts × G = {meta['samples_per_prompt']}; "
             f"{held}; greedy avg@1, %, mean ± std over seeds; Δ vs GSPO: mean [95 % interval], paired by seed and "
             "problem (two-level bootstrap).", ""]
    lines += _noise_markdown(summary, agents)
    for e in sets:
        title = SET_TITLES[e][0]
        lines += [f"## {title}", ""]
        lines += _recipe_table(summary, agents, {a: summary["before"][a][e] for a in agents},
                               lambda rec, a, e=e: rec["agents"][a][e])
    lines += _reward_markdown(summary, agents)
    lines += _pairwise_markdown(summary, agents)
    lines += _contrib_markdown(summary, agents)
    lines += _tasks_markdown(summary, agents)
    lines += _own_gradient_markdown(summary, agents)
    lines += ["## Peer rows that reached the gradient", "",
              "| recipe | " + " | ".join(f"{a}: peer rows / peer successes with a gradient" for a in agents) + " |",
              "|---|" + "---|" * len(agents)]
    for r, rec in summary["recipes"].items():
        cells = []
        for a in agents:
            g, ps = rec["agents"][a]["peer_grad_frac"], rec["agents"][a]["peer_success_grad_frac"]
            cells.append("–" if g is None else f"{100 * g:.0f} % / " + ("–" if ps is None else f"{100 * ps:.0f} %"))
        lines.append(f"| {label(r)} | " + " | ".join(cells) + " |")
    lines += ["", "## Time (seconds)", "", "| recipe | " + " | ".join(f"{a} generate / train per step" for a in agents)
              + " | per cell: steps + evaluation = total |", "|---|" + "---|" * (len(agents) + 1)]
    for r, rec in summary["recipes"].items():
        lines.append(f"| {label(r)} | " + " | ".join(
            f"{rec['agents'][a]['generate_s_per_step']:.0f} / {rec['agents'][a]['train_s_per_step']:.0f}"
            for a in agents) + f" | {rec.get('steps_s', 0):.0f} + {rec.get('eval_s', 0):.0f} = {rec['cell_s']:.0f} |")
    lines += ["", "![after-training accuracy](collab.png)", ""]
    return "\n".join(lines)


def plot(summary: dict, agents: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recipes = list(summary["recipes"])
    sets = eval_sets_of(summary["meta"])
    fig, axes = plt.subplots(1, len(sets), figsize=(4 + 2.2 * len(recipes), 4), sharey=True, squeeze=False)
    axes = axes[0]
    width = 0.8 / max(1, len(agents))
    for ax, e in zip(axes, sets):
        title = SET_TITLES[e][2]
        for i, a in enumerate(agents):
            xs = [k + i * width for k in range(len(recipes))]
            st = [summary["recipes"][r]["agents"][a][e] for r in recipes]
            ax.bar(xs, [s["mean"] for s in st], width, yerr=[s["std"] for s in st], capsize=3, label=a)
            ax.axhline(summary["before"][a][e], color=f"C{i}", ls="--", lw=1)
        ax.set_xticks([k + width * (len(agents) - 1) / 2 for k in range(len(recipes))],
                      [label(r) for r in recipes], rotation=20, ha="right", fontsize=8)
        ax.set_title(title + " (dashed: before)")
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("greedy avg@1")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def contributor_source(value: str) -> str:
    """A contributor's identity as cells and ``meta.json`` record it: the URL, or the directory resolved."""
    return value if value.startswith(("http://", "https://")) else str(Path(value).expanduser().resolve())


def check_contributor(path: Path, name: str, source: str) -> None:
    """Raise ``ValueError`` when ``meta.json`` at ``path`` names another contributor (name or source) than
    ``name`` from ``source``: two contributors' cells would mix under one recipe name."""
    old = json.loads(path.read_text()).get("contributor") if path.exists() else None
    if old and (old.get("name"), old.get("source")) != (name, source):
        raise ValueError(f"{path.parent} holds cells of contributor {old.get('name')!r} from {old.get('source')!r}; "
                         f"this run's is {name!r} from {source!r}: use another --out")


def merge_meta(path: Path, meta: dict, contributor: dict | None) -> dict:
    """``meta.json`` of this run: ``meta``, with ``contributor`` (this run's record) under ``"contributor"``, or
    the one the existing file at ``path`` holds when this run has none (its ``+contrib`` cells stay described).
    A run that adds contributor cells to a directory keeps the directory's ``"command"`` (the one its cells
    without a contributor came from); its own command is the contributor record's."""
    old = json.loads(path.read_text()) if path.exists() else {}
    site = contributor or old.get("contributor")
    command = {"command": old["command"]} if contributor and old.get("command") else {}
    return meta | command | ({"contributor": site} if site else {})


def _cli() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="cross-family",
                        help="base config: " + "; ".join(f"{k} = {v}" for k, v in PAIRS.items())
                        + " (default: cross-family)")
    parser.add_argument("--tiny", action="store_true", help="same as --pair tiny: a plumbing check, not a result")
    parser.add_argument("--config", type=Path, help="base simulate config (overrides --pair)")
    parser.add_argument("--recipes", default="",
                        help="comma-separated (default: all; without the per-task recipe on single-task pairs)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--eval-size", type=int, default=None,
                        help="held-out problems (per task on a task suite); default 64, or the config's on a task suite")
    parser.add_argument("--prompts-per-step", type=int, default=None, help="B (default: the config's)")
    parser.add_argument("--samples-per-prompt", type=int, default=None, help="G (default: the config's)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summary-only", action="store_true")
    parser.add_argument("--contributor", metavar="DIR_OR_URL",
                        help="add a rollout-only site to every cell: a local model directory (served here by "
                             "`transformers serve`; prompt from its hacrl_fed_prompt.json) or an OpenAI-compatible "
                             "/v1 URL; its cells are <recipe>+contrib")
    parser.add_argument("--contributor-name", default="contributor", help="its agent name (default: contributor)")
    parser.add_argument("--contributor-api-model", metavar="NAME", help="the endpoint's model name (with a URL)")
    parser.add_argument("--contributor-api-key-env", metavar="VAR",
                        help="environment variable holding the endpoint's API key (with a URL)")
    parser.add_argument("--contributor-device", default="cpu", help="device of the served model (default: cpu)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _cli()
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if args.summary_only:
        summarize(out)
        print((out / "results.md").read_text())
        return 0

    from hacrl_fed.config import SimulateConfig, load_config
    from hacrl_fed.protocol.keys import validate_agent_name

    pair = "tiny" if args.tiny else args.pair
    cfg = load_config(args.config or ROOT / PAIRS[pair], SimulateConfig)
    suite = cfg.run.data.source == "reasoning_gym"
    if args.eval_size is not None or not suite:
        cfg.run.data.eval_size = 64 if args.eval_size is None else args.eval_size
    if args.prompts_per_step:
        cfg.run.prompts_per_step = args.prompts_per_step
    if args.samples_per_prompt:
        cfg.run.samples_per_prompt = args.samples_per_prompt
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()] or [
        r for r in RECIPES if suite or r not in ALGO]
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown:
        parser.error(f"unknown recipe(s) {unknown}; choose from {', '.join(RECIPES)}")
    if args.contributor:
        try:
            validate_agent_name(args.contributor_name)
        except ValueError as err:
            parser.error(f"--contributor-name: {err}")
        if args.contributor_name in {a.name for a in cfg.agents}:
            parser.error(f"--contributor-name {args.contributor_name!r} is a learner of the config; choose another")
        source = contributor_source(args.contributor)
        url = args.contributor.startswith(("http://", "https://"))
        if url and not args.contributor_api_model:
            parser.error("--contributor URL needs --contributor-api-model NAME (the endpoint's model name)")
        if not url and not Path(source).is_dir():
            parser.error(f"--contributor {args.contributor}: neither an http(s) URL nor a model directory")
        try:
            check_contributor(out / "meta.json", args.contributor_name, source)
        except ValueError as err:
            parser.error(str(err))
    (out / "cells").mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/run_collab.py " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = {"command": command, "pair": pair, "steps": args.steps, "seeds": args.seeds,
            "prompts_per_step": cfg.run.prompts_per_step, "samples_per_prompt": cfg.run.samples_per_prompt,
            "eval_size": cfg.run.data.eval_size, "models": {a.name: a.model.name_or_path for a in cfg.agents},
            "config": str(args.config or PAIRS[pair])}
    with contextlib.ExitStack() as stack:
        site = None
        if args.contributor:
            site = _add_contributor(stack, cfg, args, out)
            site["command"] = command
        meta = merge_meta(out / "meta.json", meta, site)
        run_benchmark(cfg, out, meta, recipes, args.seeds, args.steps, suite, site)
    summarize(out)
    print((out / "results.md").read_text())
    return 0


def _add_contributor(stack: contextlib.ExitStack, cfg, args, out: Path) -> dict:
    """Open the contributor of ``--contributor`` for the rest of the run (a local directory: its server is
    stopped when ``stack`` closes, SIGTERM included), append its rollout-only agent to ``cfg.agents``, and return
    its record (:meth:`contributor.Contributor.record`)."""
    from contributor import contributor_agent, open_contributor, sigterm_as_interrupt

    stack.enter_context(sigterm_as_interrupt())
    print(f"[contributor] {args.contributor}: starting", flush=True)
    c = stack.enter_context(open_contributor(
        args.contributor, name=args.contributor_name, api_model=args.contributor_api_model,
        default_system_prompt=cfg.agents[0].model.system_prompt, top_k=cfg.run.sampling.top_k, log_dir=out,
        device=args.contributor_device))
    cfg.agents.append(contributor_agent(c, verifier=cfg.agents[0].verifier, api_key_env=args.contributor_api_key_env))
    print(f"[contributor] {c.name} at {c.url} (model {c.api_model}; prompt from {c.prompt_from})", flush=True)
    return c.record()


def run_benchmark(cfg, out: Path, meta: dict, recipes: list[str], seeds: int, steps: int, suite: bool,
                  contributor: dict | None) -> None:
    """Load the federation once, write ``meta.json`` and (once) ``before.json``, then run every missing cell,
    seed-major, each written to ``cells/`` and the summary rebuilt after it."""
    from hacrl_fed.data.arithmetic import reword
    from inproc import Federation

    fed = Federation(cfg)
    try:
        evaluate = fed.evaluate
        if suite:   # held-out items of the trained tasks, and the held-out task families; outcomes per problem
            trained = {t.label for t in cfg.run.data.tasks}
            eval_sets = {"held_out": [p for p in fed.held_out if p.source in trained],
                         "families": [p for p in fed.held_out if p.source not in trained]}
            eval_sets = {k: v for k, v in eval_sets.items() if v}
            evaluate = fed.evaluate_outcomes
            meta["tasks"] = {p.id: p.source for p in fed.held_out}
        elif cfg.run.data.source == "episodes":   # each held-out game's reward: won at 1, else how close it came
            eval_sets = {"held_out": list(fed.held_out)}
            evaluate = fed.evaluate_rewards
        else:
            eval_sets = {"held_out": list(fed.held_out)}
            try:
                eval_sets["words"] = [reword(p) for p in fed.held_out]
            except ValueError:
                pass
        meta["eval_sets"] = list(eval_sets)
        (out / "meta.json").write_text(json.dumps(meta, indent=1))
        before_path = out / "before.json"
        if not before_path.exists():
            t = time.perf_counter()
            res, texts = evaluate_sets(fed, evaluate, eval_sets)
            before = {"agents": {a: res[a] for a in fed.learners},
                      "eval_s": time.perf_counter() - t, "load_s": fed.load_s}
            if texts:
                before["responses"] = {a: texts[a] for a in fed.learners}
            before_path.write_text(json.dumps(before, indent=1))
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
    finally:
        fed.close()


if __name__ == "__main__":
    raise SystemExit(main())
