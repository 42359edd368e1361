"""The collaboration benchmark (``benchmarks/run_collab.py``, the command) in its parts, one module per job:

* :mod:`collab.recipes` — recipe, pair and evaluation-set names, labels, which recipes are compared;
* :mod:`collab.scoring` — a cell's per-problem entries (right/wrong, outcome, episode reward) as numbers;
* :mod:`collab.cells` — running one (recipe, seed) cell and what it records; the resumable loop over cells;
* :mod:`collab.evaluation` — which held-out sets a run evaluates on, and evaluating every learner on them;
* :mod:`collab.stats` — paired comparisons of two recipes through :mod:`hacrl_fed.report.stats` (t intervals,
  variance components, minimum detectable effects);
* :mod:`collab.page` — the generated tables of ``docs/results.md`` (``benchmarks/results_page.py``);
* :mod:`collab.summary` — the numbers of a results directory from its cells (pure);
* :mod:`collab.render` / :mod:`collab.plot` — ``results.md`` and ``collab.png`` from the summary;
* :mod:`collab.results` — a results directory's files: ``meta.json`` and the rebuilt summary files.

Import with ``benchmarks/`` on ``sys.path`` (as the benchmark scripts and tests do).
"""
