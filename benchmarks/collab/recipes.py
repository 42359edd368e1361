"""The collaboration benchmark's names: recipes, their labels and algorithm settings, the pairs (base configs),
the evaluation sets, and which recipes are compared with which (``benchmarks/run_collab.py``)."""

from __future__ import annotations


RECIPES = ("gspo", "hacpo_cross_family", "hacpo", "naive", "gspo_x2", "hacpo_cross_family_task",
           "hacpo_cross_family_distill")
LABELS = {"gspo": "GSPO (isolated)", "gspo_x2": "GSPO×2 (isolated, 2G)", "naive": "naive sharing",
          "hacpo": "HACPO (paper)", "hacpo_cross_family": "HACPO cross-family",
          "hacpo_cross_family_task": "HACPO cross-family, capability per task",
          "hacpo_cross_family_distill": "HACPO cross-family + peer distillation"}
DISTILL_COEF = 0.5
"""λ₀ of the peer distillation recipe (constant schedule, indicator weights; ``hacrl_fed.algo.peer_distill``): a
setting of this benchmark, not a tuned value."""
ALGO = {"hacpo_cross_family_task": {"name": "hacpo_cross_family", "capability_scope": "task"},
        "hacpo_cross_family_distill": {"name": "hacpo_cross_family", "peer_distill_coef": DISTILL_COEF}}
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
COLLABORATIVE = ("hacpo_cross_family", "hacpo", "naive", "hacpo_cross_family_task", "hacpo_cross_family_distill")
PAIRWISE_BASES = ("hacpo", "gspo_x2")
"""Besides Δ vs GSPO, each collaborative recipe is compared with the paper's HACPO (does an extension add
anything?) and with GSPO×2 (is it the peer's rollouts or just their number?)."""
TWINS = {"hacpo_cross_family_task": "hacpo_cross_family", "hacpo_cross_family_distill": "hacpo_cross_family"}
"""A named option's recipe → the same recipe without it (its difference isolates the option)."""
CONTRIB = "+contrib"
"""Suffix of a recipe whose cells had the rollout-only contributor (``--contributor``): ``hacpo+contrib``."""
CONTRIB_COUNTS = ("delivered", "rows", "no_logprob_rows", "grad_rows", "pos_adv_rows", "pos_adv_grad_rows",
                  "dropped_truncated", "screened_out", "distill_rows")
"""The row counts of :func:`contributor_rows`, summed over steps and seeds in the summary."""


def base_recipe(recipe: str) -> str:
    """``hacpo+contrib`` → ``hacpo``; a recipe without the suffix is its own base."""
    return recipe.removesuffix(CONTRIB)


def twin_with_contrib(recipe: str) -> str | None:
    """For ``<option>+contrib`` (a named option's recipe with the contributor), ``<twin>+contrib``: the same recipe
    without the option, also with the contributor (:data:`TWINS`); None for any other recipe."""
    base = base_recipe(recipe)
    return TWINS[base] + CONTRIB if base != recipe and base in TWINS else None


def label(recipe: str) -> str:
    """A recipe's name in the tables: its label, ``+ contributor`` for a cell with the rollout-only site."""
    base = base_recipe(recipe)
    return LABELS.get(base, base) + (" + contributor" if recipe != base else "")


def eval_sets_of(meta: dict) -> tuple[str, ...]:
    """The evaluation sets of a benchmark directory (older ones: held-out + other wording)."""
    return tuple(meta.get("eval_sets") or EVAL_SETS)
