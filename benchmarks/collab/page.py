"""The results tables of ``docs/results.md``, made from the committed cells by the benchmark's summary code.

A generated table sits in the page between ``<!-- table: NAME -->`` and ``<!-- end table -->``; :data:`TABLES`
says, per NAME, the results directory and what each cell of the table is. :func:`render_page` rewrites every
such block from the cells (``python benchmarks/results_page.py`` writes it, ``--check`` fails on a difference;
``tests/launch/test_results_page.py`` runs the check), so no number in those tables can drift from the cells.

Cell specs: a plain string is written as is; otherwise a tuple ``(kind, …)``:

* ``("seeds", recipe, agent, set)`` — accuracy per seed, ``76.6 / 45.3 / 64.1`` (seed order);
* ``("acc", recipe, agent, set)`` — mean ± std over seeds (``33.6`` with one seed);
* ``("acc_seeds", recipe, agent, set)`` — mean and per seed, ``33.6 (32.0, 35.2)``;
* ``("before", agent, set)`` — accuracy before training;
* ``("before_task", agent, set, task)`` — accuracy before training on one task's items (``meta.json``'s
  ``tasks`` map, :func:`load`);
* ``("won_reward", recipe, agent, set)`` — per seed ``won % / mean reward ×100``, seeds joined by `` · ``
  (``recipe`` ``"before"`` for the shared evaluation before training);
* ``("diff", recipe, base, agent, set[, "reward"])`` — mean difference a − b, points, with its 95 % t interval on
  the seeds' degrees of freedom (:mod:`collab.stats`), bold when the interval excludes 0; with one seed the
  difference and "(1 seed)";
* ``("per_seed", recipe, base, agent, set)`` — the difference per seed, ``+13.3, +7.0``;
* ``("mde", recipe, base, agent, set)`` — the minimum detectable effect at the seeds and problems run;
* ``("contrib_grad", agent)`` — of the rollout-only contributor's pooled rows (``hacpo_cross_family+contrib``),
  the share that reached ``agent``'s gradient, ``33 % (211 of 640)``;
* ``("contrib_rows", recipe, agent)`` — of the contributor's pooled rows under a ``+contrib`` recipe, those in
  ``agent``'s update, those that reached its gradient and those its peer distillation term took, ``80 / 21 / 0 of
  320``;
* ``("async", site, what)`` — from an ``async_vs_sync.py`` directory's ``results.json`` (seed 0), ``what`` one of
  ``rate_sync``, ``rate_async`` (updates per hour), ``at_steps`` (held-out after N own updates, sync → async),
  ``at_time`` (at the sync run's wall time T, sync → async, with async's own updates by then), ``dropped``.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

from collab.scoring import accuracy, is_correct, mean_reward, reward_of
from collab.stats import paired, paired_mde
from collab.summary import contributor_summary

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "results.md"
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end table -->)", re.S)

_G, _S = "gemma3", "smollm2"
_TEN = [(_G, "held_out"), (_G, "words"), (_S, "held_out"), (_S, "words")]
_SPECIALIST_TASKS = ("chain_sum", "basic_arithmetic", "products", "decimal_chain_sum")
_SAME = [("smollm2", "held_out"), ("smollm2", "words"), ("smollm2-trained", "held_out"),
         ("smollm2-trained", "words")]


def _rows_10step() -> list[list]:
    rows = []
    for r, name, short in (("gspo", "GSPO (isolated)", "GSPO"),
                           ("hacpo_cross_family", "HACPO cross-family", "HACPO cross-family"),
                           ("hacpo", "HACPO (paper)", "HACPO (paper)"), ("naive", "naive sharing", "naive sharing"),
                           ("gspo_x2", "GSPO×2 (isolated, 2G own rollouts)", "GSPO×2")):
        rows.append([f"{name}, 0 / 1 / 2", *[("seeds", r, a, e) for a, e in _TEN]])
        rows.append([f"{short}, mean ± std", *[("acc", r, a, e) for a, e in _TEN]])
    rows.append(["HACPO cross-family − GSPO (95 % t interval, paired by seed and problem)",
                 *[("diff", "hacpo_cross_family", "gspo", a, e) for a, e in _TEN]])
    rows.append(["minimum detectable effect of that difference (3 seeds, 64 problems)",
                 *[("mde", "hacpo_cross_family", "gspo", a, e) for a, e in _TEN]])
    return rows


def _rows_tasks() -> list[list]:
    cols = [(_G, "gspo"), (_G, "gspo_x2"), (_S, "gspo"), (_S, "gspo_x2")]
    return [[name, *[("diff", r, b, a, "held_out") for a, b in cols]]
            for r, name in (("hacpo_cross_family", "HACPO cross-family"), ("naive", "naive sharing"),
                            ("hacpo_cross_family_task", "HACPO cross-family, capability per task"),
                            ("hacpo", "HACPO (paper)"))] + [
        ["per seed, HACPO cross-family", *[("per_seed", "hacpo_cross_family", b, a, "held_out") for a, b in cols]],
        ["minimum detectable effect, HACPO cross-family", *[("mde", "hacpo_cross_family", b, a, "held_out")
                                                             for a, b in cols]]]


def _episode_contrast(baseline: str, won_label: str, mde_label: str) -> list[list]:
    """The multi-turn table's rows of HACPO cross-family − ``baseline`` for both learners: Δ games won, Δ mean
    reward (paired by seed and game) and the MDE of Δ won."""
    return [[f"{won_label} [95 % t interval, paired by seed and game]",
             *(("diff", "hacpo_cross_family", baseline, a, "held_out") for a in (_G, _S))],
            ["Δ mean reward, the same", *(("diff", "hacpo_cross_family", baseline, a, "held_out", "reward")
                                          for a in (_G, _S))],
            [mde_label, *(("mde", "hacpo_cross_family", baseline, a, "held_out") for a in (_G, _S))]]


TABLES: dict[str, dict] = {
    "collab-10step": {
        "dir": "benchmarks/results/collab-10step",
        "header": ["recipe, seed", "Gemma held-out", "Gemma other wording", "SmolLM2 held-out",
                   "SmolLM2 other wording"],
        "rows": _rows_10step()},
    "same-family-10step": {
        "dir": "benchmarks/results/same-family-10step",
        "header": ["recipe (mean ± std, 3 seeds)", "SmolLM2 held-out", "SmolLM2 other wording",
                   "trained SmolLM2 held-out", "trained SmolLM2 other wording"],
        "rows": [["before training", *[("before", a, e) for a, e in _SAME]],
                 *[[name, *[("acc", r, a, e) for a, e in _SAME]]
                   for r, name in (("gspo", "GSPO (isolated)"), ("hacpo", "HACPO (paper)"),
                                   ("hacpo_cross_family", "HACPO cross-family"), ("naive", "naive sharing"),
                                   ("gspo_x2", "GSPO×2 (isolated, 2G)"))],
                 ["HACPO (paper) − GSPO (95 % t interval)", *[("diff", "hacpo", "gspo", a, e) for a, e in _SAME]],
                 ["HACPO cross-family − HACPO (paper)",
                  *[("diff", "hacpo_cross_family", "hacpo", a, e) for a, e in _SAME]]]},
    "collab-tasks": {
        "dir": "benchmarks/results/collab-tasks",
        "header": ["recipe", "Gemma − isolated GSPO", "Gemma − GSPO×2", "SmolLM2 − isolated GSPO",
                   "SmolLM2 − GSPO×2"],
        "rows": _rows_tasks()},
    "collab-tasks-contributor": {
        "dir": "benchmarks/results/collab-tasks",
        "header": ["learner", "evaluation set", "without the contributor", "with it", "Δ",
                   "its rows that reached the learner's gradient"],
        "rows": [[name, title, ("acc_seeds", "hacpo_cross_family", a, e),
                  ("acc_seeds", "hacpo_cross_family+contrib", a, e),
                  ("diff", "hacpo_cross_family+contrib", "hacpo_cross_family", a, e),
                  ("contrib_grad", a) if e == "held_out" else ""]
                 for a, name in ((_G, "Gemma-3-270M"), (_S, "SmolLM2-135M"))
                 for e, title in (("held_out", "trained tasks, held-out items"), ("families", "held-out families"))]},
    "collab-tasks-distillation": {
        "dir": "benchmarks/results/collab-tasks",
        "header": ["learner", "evaluation set", "HACPO cross-family", "+ peer distillation",
                   "Δ (distillation − without)", "Δ vs GSPO×2"],
        "rows": [[name, title, ("acc_seeds", "hacpo_cross_family", a, e),
                  ("acc_seeds", "hacpo_cross_family_distill", a, e),
                  ("diff", "hacpo_cross_family_distill", "hacpo_cross_family", a, e),
                  ("diff", "hacpo_cross_family_distill", "gspo_x2", a, e)]
                 for a, name in ((_G, "Gemma-3-270M"), (_S, "SmolLM2-135M"))
                 for e, title in (("held_out", "trained tasks, held-out items"), ("families", "held-out families"))]},
    "families-strong-contributor": {
        "dir": "benchmarks/results/collab-tasks-families-trained",
        "header": ["recipe (64 held-out items of the two far families)", "Gemma-3-270M", "SmolLM2-135M"],
        "rows": [["before training", ("before", _G, "held_out"), ("before", _S, "held_out")],
                 *[[f"{name}, mean (per seed)", ("acc_seeds", r, _G, "held_out"), ("acc_seeds", r, _S, "held_out")]
                   for r, name in (("gspo", "isolated GSPO"), ("hacpo_cross_family", "HACPO cross-family"),
                                   ("hacpo_cross_family+contrib", "HACPO cross-family + strong contributor"),
                                   ("hacpo_cross_family_distill+contrib",
                                    "HACPO cross-family + peer distillation + strong contributor"))],
                 ["**primary**: + peer distillation, both with the contributor",
                  *[("diff", "hacpo_cross_family_distill+contrib", "hacpo_cross_family+contrib", a, "held_out")
                    for a in (_G, _S)]],
                 ["the contributor, without distillation: HACPO cross-family + contributor − HACPO cross-family",
                  *[("diff", "hacpo_cross_family+contrib", "hacpo_cross_family", a, "held_out") for a in (_G, _S)]],
                 ["HACPO cross-family + contributor − isolated GSPO",
                  *[("diff", "hacpo_cross_family+contrib", "gspo", a, "held_out") for a in (_G, _S)]],
                 ["HACPO cross-family + peer distillation + contributor − isolated GSPO",
                  *[("diff", "hacpo_cross_family_distill+contrib", "gspo", a, "held_out") for a in (_G, _S)]],
                 *[[f"the contributor's rows, {name}: in the update / reached the gradient / distilled, of pooled",
                    ("contrib_rows", r, _G), ("contrib_rows", r, _S)]
                   for r, name in (("hacpo_cross_family+contrib", "without distillation"),
                                   ("hacpo_cross_family_distill+contrib", "with distillation"))]]},
    "specialists-before": {
        "dir": "benchmarks/results/collab-specialists",
        "header": ["site (its own tasks)", *_SPECIALIST_TASKS],
        "rows": [[f"`{site}` ({own})", *[("before_task", site, "held_out", t) for t in _SPECIALIST_TASKS]]
                 for site, own in (("smollm2_a", "chain_sum, basic_arithmetic"),
                                   ("smollm2_b", "products, decimal_chain_sum"))]},
    "collab-episodes": {
        "dir": "benchmarks/results/collab-episodes",
        "header": ["recipe", "Gemma-3-270M", "SmolLM2-135M"],
        "rows": [["before training", ("won_reward", "before", _G, "held_out"), ("won_reward", "before", _S, "held_out")],
                 ["isolated GSPO, seed 0 · seed 1", ("won_reward", "gspo", _G, "held_out"),
                  ("won_reward", "gspo", _S, "held_out")],
                 ["HACPO cross-family (the recommended recipe), seed 0 · seed 1",
                  ("won_reward", "hacpo_cross_family", _G, "held_out"),
                  ("won_reward", "hacpo_cross_family", _S, "held_out")],
                 *_episode_contrast(
                     "gspo", "Δ won, HACPO − GSPO", "minimum detectable effect of Δ won (2 seeds, 32 games)"),
                 ["GSPO×2 (isolated, 2G own rollouts: HACPO's 80 updates), per seed run",
                  ("won_reward", "gspo_x2", _G, "held_out"), ("won_reward", "gspo_x2", _S, "held_out")],
                 *_episode_contrast("gspo_x2", "Δ won, HACPO − GSPO×2",
                                    "minimum detectable effect of Δ won against GSPO×2 (seeds run, 32 games)")]},
    "async-vs-sync": {
        "dir": "benchmarks/results/async-vs-sync",
        "header": ["site", "updates/h sync", "updates/h async", "held-out after 8 own updates, sync → async",
                   "held-out at equal wall time T, sync → async (async's own updates by T)",
                   "async, at its last update", "async peer rows dropped as stale"],
        "rows": [[name, ("async", site, "rate_sync"), ("async", site, "rate_async"), ("async", site, "at_steps"),
                  ("async", site, "at_time"), last, ("async", site, "dropped")]
                 for site, name, last in (("smollm2-a", "smollm2-a", "33.3 % (78 updates)"),
                                          ("smollm2-b", "smollm2-b", "29.2 % (79 updates)"),
                                          ("smollm2-slow", "smollm2-slow (3×)", "25.0 % (8 updates)"))]},
}
"""Table name → ``dir`` (its results directory), ``header`` and ``rows`` of cell specs (module docstring)."""


def _num(x: float, signed: bool = False) -> str:
    return (f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}").replace("-", "−")


def load(directory: Path) -> tuple[dict, dict[str, list[dict]]]:
    """``before.json`` and the cells of a results directory, recipe → cells sorted by seed; ``before["tasks"]`` is
    ``meta.json``'s problem id → task map (as the summary reads it; empty without one)."""
    before = json.loads((directory / "before.json").read_text())
    meta = directory / "meta.json"
    before["tasks"] = (json.loads(meta.read_text()).get("tasks") or {}) if meta.is_file() else {}
    cells: dict[str, list[dict]] = {}
    for f in sorted((directory / "cells").glob("*.json")):
        c = json.loads(f.read_text())
        cells.setdefault(c["recipe"], []).append(c)
    return before, {r: sorted(cs, key=lambda c: c["seed"]) for r, cs in cells.items()}


def _async_cell(site: str, what: str, results: dict) -> str:
    s = results["seeds"]["0"]["sites"][site]
    pct = (lambda x: f"{100 * x:.1f} %")
    if what in ("rate_sync", "rate_async"):
        return f"{s[what.removeprefix('rate_')]['updates_per_hour']:.0f}"
    if what == "at_steps":
        return f"{pct(s['sync']['at_steps'])} → {pct(s['async']['at_steps'])}"
    if what == "at_time":
        return (f"{pct(s['sync']['at_sync_time'])} → {pct(s['async']['at_sync_time'])} "
                f"({s['async']['own_step_at_sync_time']})")
    if what == "dropped":
        return f"{100 * s['async']['dropped_share']:.0f} %"
    raise ValueError(f"unknown async figure {what!r}")


NOT_RUN = "–"
"""A cell whose recipe has no cell in the directory yet (a benchmark in progress, or cells superseded)."""


def _recipes_of(kind: str, args: list) -> list[str]:
    """The recipes a cell spec reads (module docstring)."""
    if kind in ("seeds", "acc", "acc_seeds", "contrib_rows"):
        return [args[0]]
    if kind == "won_reward":
        return [] if args[0] == "before" else [args[0]]
    if kind in ("diff", "per_seed", "mde"):
        return [args[0], args[1]]
    if kind == "contrib_grad":
        return ["hacpo_cross_family+contrib"]
    return []


def cell(spec, before: dict, cells: dict[str, list[dict]]) -> str:
    """One table cell from its spec (module docstring); for ``async`` cells ``before`` is ``results.json``."""
    if isinstance(spec, str):
        return spec
    kind, *args = spec
    if kind == "async":
        return _async_cell(*args, before)
    if any(r not in cells for r in _recipes_of(kind, args)):
        return NOT_RUN
    if kind == "before":
        a, e = args
        return _num(accuracy(before["agents"][a][e]))
    if kind == "before_task":
        a, e, task = args
        return _num(accuracy(before["agents"][a][e], {p for p, t in before["tasks"].items() if t == task}))
    if kind in ("seeds", "acc", "acc_seeds"):
        r, a, e = args
        xs = [accuracy(c["after"][a][e]) for c in cells[r]]
        if kind == "seeds":
            return " / ".join(_num(x) for x in xs)
        mean = statistics.fmean(xs)
        if kind == "acc_seeds":
            return f"{_num(mean)} ({', '.join(_num(x) for x in xs)})"
        return f"{_num(mean)} ± {_num(statistics.stdev(xs))}" if len(xs) > 1 else _num(mean)
    if kind == "won_reward":
        r, a, e = args
        runs = [before["agents"][a][e]] if r == "before" else [c["after"][a][e] for c in cells[r]]
        return " · ".join(f"{_num(accuracy(x))} / {_num(mean_reward(x))}" for x in runs)
    if kind in ("diff", "per_seed"):
        r, b, a, e, *what = args
        res = paired(cells[r], cells[b], a, e, value=reward_of if what == ["reward"] else is_correct)
        if kind == "per_seed":
            return ", ".join(_num(x, True) for x in res.per_seed)
        if math.isnan(res.low):
            return f"{_num(res.mean, True)} ({res.n} seed)"
        text = f"{_num(res.mean, True)} [{_num(res.low, True)}, {_num(res.high, True)}]"
        return f"**{_num(res.mean, True)}** [{_num(res.low, True)}, {_num(res.high, True)}]" \
            if res.low > 0 or res.high < 0 else text
    if kind == "contrib_grad":
        (a,) = args
        got = contributor_summary(cells["hacpo_cross_family+contrib"], a)
        return f"{100 * got['share']:.0f} % ({got['grad_rows']:.0f} of {got['delivered']:.0f})"
    if kind == "contrib_rows":
        r, a = args
        got = contributor_summary(cells[r], a)
        return f"{got['rows']:.0f} / {got['grad_rows']:.0f} / {got['distill_rows']:.0f} of {got['delivered']:.0f}"
    if kind == "mde":
        r, b, a, e = args
        m = paired_mde(cells[r], cells[b], a, e)["mde"]
        return "–" if m is None else _num(m)
    raise ValueError(f"unknown cell kind {kind!r}")


def render_table(name: str, root: Path = ROOT) -> str:
    """The Markdown of table ``name`` of :data:`TABLES`, recomputed from its cells."""
    spec = TABLES[name]
    directory = root / spec["dir"]
    if (directory / "before.json").exists():   # a collaboration directory (its cells/ may not exist yet)
        before, cells = load(directory)
    else:   # async_vs_sync.py: its summary code's results.json, rebuilt from its cells
        before, cells = json.loads((directory / "results.json").read_text()), {}
    lines = ["| " + " | ".join(spec["header"]) + " |", "|" + "---|" * len(spec["header"])]
    lines += ["| " + " | ".join(cell(c, before, cells) for c in row) + " |" for row in spec["rows"]]
    return "\n".join(lines) + "\n"


def render_page(text: str, root: Path = ROOT) -> str:
    """``text`` (the page) with every generated block rewritten; an unknown table name is an error."""
    def sub(m: re.Match) -> str:
        if m["name"] not in TABLES:
            raise ValueError(f"docs/results.md names an unknown table {m['name']!r}")
        return m.group(1) + render_table(m["name"], root) + m.group(4)
    return BLOCK.sub(sub, text)


def refresh_page(directory: Path, page: Path = PAGE, root: Path = ROOT) -> list[str]:
    """Rewrite ``page``'s generated tables if any of them is made from results ``directory`` (called by the
    benchmark after each cell it writes, so a committed cell and the page never disagree). Returns the names of the
    tables made from ``directory`` ([] and nothing written when none is, or when the page is missing).

    Raises what :func:`render_page` raises (``ValueError``, ``OSError``, ``KeyError``); the caller reports it."""
    directory = Path(directory).resolve()
    names = [n for n, spec in TABLES.items() if (root / spec["dir"]).resolve() == directory]
    if not names or not page.is_file():
        return []
    from hacrl_fed.atomic import atomic_write_text

    text = page.read_text(encoding="utf-8")
    new = render_page(text, root)
    if new != text:
        atomic_write_text(page, new)
    return names
