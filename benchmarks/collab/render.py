"""``results.md`` of the collaboration benchmark: the summary (:func:`collab.summary.summary_of`) as Markdown
tables."""

from __future__ import annotations

import math

from collab.recipes import PAIRWISE_BASES, SET_TITLES, TWINS, base_recipe, eval_sets_of, label, twin_with_contrib
from collab.scoring import OUTCOMES
from collab.summary import mechanism


def _pm(s: dict) -> str:
    return f"{100 * s['mean']:.1f} ± {100 * s['std']:.1f}" if s["n"] > 1 else f"{100 * s['mean']:.1f}"


def _ci(t) -> str:
    """``+2.3 [−97.8, +102.5]`` (points); with one paired seed, no interval: ``+25.0 (1 seed)``."""
    if t is None:
        return "—"
    m, lo, hi = t
    if math.isnan(m):
        return "—"
    if lo is None or math.isnan(lo):
        return f"{100 * m:+.1f} (1 seed)"
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
        if base_recipe(r) not in summary["recipes"]:       # nothing to pair with: the option's table below, if any
            continue
        lines.append(f"| {label(r)} − {label(base_recipe(r))} | " + " | ".join(
            _ci(rec["agents"][a][e].get("vs_without_contrib")) for a in agents for e in sets) + " |")
    lines += _option_with_contrib_markdown(summary, rows, agents, sets)
    lines += ["", "The contributor per cell: steps its batch was pooled, its coordinator-verified accuracy (mean over "
              "pooled steps), generation seconds per step; per learner, of the contributor's pooled rows (summed over "
              "steps and seeds): the share that entered the learner's update and the share that reached its gradient "
              "(`contributor_rows()` in this script says what counts), and the rows the learner's screens dropped or cut "
              "and those its peer distillation term took (a quarantined source's rows are neither: they never enter "
              "the update).", "",
              "| recipe | pooled steps | contributor accuracy | s / step | "
              + " | ".join(f"{a}: in update / reached gradient (rows with a gradient of rows pooled); screened out, distilled"
                         for a in agents)
              + " |",
              "|---|---|---|---|" + "---|" * len(agents)]
    for r, rec in rows:
        c = rec["contributor"]
        acc, gen = c["accuracy_mean"], c["generate_s_per_step"]
        cells = [f"{_pct(x['in_update_share'])} / {_pct(x['share'])} ({x['grad_rows']:.0f} of {x['delivered']:.0f}); "
                 f"screened out {x.get('screened_out', 0):.0f}, distilled {x.get('distill_rows', 0):.0f}"
                 for x in (rec["agents"][a]["contributor"] for a in agents)]
        lines.append(f"| {label(r)} | {c['accepted_steps']} / {c['steps']} | "
                     f"{'–' if acc is None else f'{100 * acc:.1f} %'} | {'–' if gen is None else f'{gen:.0f}'} | "
                     + " | ".join(cells) + " |")
    return lines + [""]


def _option_with_contrib_markdown(summary: dict, rows: list, agents: list[str], sets: tuple[str, ...]) -> list[str]:
    """A named option with the contributor against its twin with the contributor (both sides had the same site):
    Δ per evaluation set with its MDE, and per task (task suites). Empty where no such pair of recipes ran."""
    opts = [(r, rec) for r, rec in rows if twin_with_contrib(r) in summary["recipes"]]
    if not opts:
        return []

    def cell(x: dict, key: str) -> str:
        m = x.get("mde_" + key) or {}
        return _ci(x.get(key)) + (f", MDE {100 * m['mde']:.1f}" if m.get("mde") is not None else "")

    lines = ["", "A named option, both sides with the contributor: Δ = recipe + contributor − the recipe without the "
             "option + contributor, points, mean [95 % interval] paired by seed and problem, and the minimum detectable "
             "effect at the seeds and problems run (80 % power; none below 2 seeds).", "",
             "| option + contributor − without it + contributor | "
             + " | ".join(f"{a} {SET_TITLES[e][1]}" for a in agents for e in sets) + " |",
             "|---|" + "---|" * (len(sets) * len(agents))]
    for r, rec in opts:
        lines.append(f"| {label(r)} − {label(twin_with_contrib(r))} | " + " | ".join(
            cell(rec["agents"][a][e], "vs_twin_with_contrib") for a in agents for e in sets) + " |")
    tasks = sorted({t for _, rec in opts for a in agents for t in rec["agents"][a].get("tasks", {})})
    if tasks:
        lines += ["", "The same per task:", "",
                  "| option + contributor − without it + contributor | "
                  + " | ".join(f"{a}: {t}" for a in agents for t in tasks) + " |",
                  "|---|" + "---|" * (len(tasks) * len(agents))]
        for r, rec in opts:
            lines.append(f"| {label(r)} − {label(twin_with_contrib(r))} | " + " | ".join(
                _ci((rec["agents"][a].get("tasks", {}).get(t) or {}).get("vs_twin_with_contrib"))
                for a in agents for t in tasks) + " |")
    return lines


def _noise_markdown(summary: dict, agents: list[str]) -> list[str]:
    """The power of each comparison with GSPO (and of the collaborative recipes with :data:`PAIRWISE_BASES`), from
    the two-way model of its paired differences (:func:`collab.stats.paired_mde`)."""
    sets = eval_sets_of(summary["meta"])
    rows = [(r, b, a, e, m) for r, rec in summary["recipes"].items() for a in agents for e in sets
            for b, m in (("gspo", rec["agents"][a][e].get("mde_vs_gspo")),
                         *(rec["agents"][a][e].get("mde_vs") or {}).items())
            if m and m.get("mde") is not None]
    if not rows:
        return []
    f = (lambda x: "–" if x is None else f"{100 * x:.1f}")
    lines = ["## Noise and minimum detectable effect", "",
             "Per comparison, paired by seed and problem (`hacrl_fed/report/stats.py`): the standard deviations of "
             "the seed, problem and residual components of the difference (two-way crossed model, ANOVA "
             "estimates), the minimum detectable effect at the seeds n and problems m run (80 % power, two-sided "
             "5 %, t on n − 1 degrees of freedom, Var = σ²_seed/n + σ²_problem/m + σ²_resid/(n·m)), the seeds that "
             "would detect 5 points at the same m (– : none, the problems alone keep it above), and the MDE the m "
             "problems leave with unlimited seeds; points.", "",
             "| recipe − baseline | agent | set | seeds | problems | sd seed | sd problem | sd residual | "
             "minimum detectable effect | seeds for 5 points | with unlimited seeds |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, b, a, e, m in rows:
        lines.append(f"| {label(r)} − {label(b)} | {a} | {SET_TITLES[e][1]} | {m['seeds']} | {m['problems']} | "
                     f"{f(m['sd_seed'])} | {f(m['sd_problem'])} | {f(m['sd_resid'])} | {f(m['mde'])} | "
                     f"{m['seeds_for_5_points'] or '–'} | {f(m['floor'])} |")
    return lines + [""]


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


def _iqm_markdown(summary: dict, agents: list[str]) -> list[str]:
    """A second view on a task suite: the difference of interquartile means over (seed × trained task)
    accuracies with the stratified bootstrap's 95 % percentile interval (:func:`collab.stats.iqm_vs`)."""
    rows = [(r, b, a, got) for r, per in summary.get("iqm", {}).items() for a in agents
            for b, got in per[a].items() if got]
    if not rows:
        return []
    lines = ["## Second view: interquartile mean over seeds × tasks", "",
             "The interquartile mean (IQM) of a recipe's accuracy over its (seed, trained task) cells, and the "
             "difference recipe − baseline with a 95 % percentile interval of the stratified bootstrap (seeds "
             "resampled within each task, the same draws for both recipes; Agarwal et al. 2021, rliable's method; "
             "`hacrl_fed/report/stats.py`), points. With few seeds the bootstrap has few distinct resamples: a "
             "second view beside the t intervals above, not a substitute.", "",
             "| recipe − baseline | agent | seeds × tasks | IQM recipe | IQM baseline | difference [95 % interval] |",
             "|---|---|---|---|---|---|"]
    for r, b, a, got in rows:
        lines.append(f"| {label(r)} − {label(b)} | {a} | {got['seeds']} × {got['tasks']} | {100 * got['iqm']:.1f} | "
                     f"{100 * got['iqm_base']:.1f} | {_ci(got['diff'])} |")
    return lines + [""]


def command_line(meta: dict) -> str:
    """The summary's first line: the command of the directory's cells, or every command that added some (``meta``'s
    ``commands``, :func:`collab.results.merge_meta`)."""
    commands = meta.get("commands") or [meta["command"]]
    if len(commands) == 1:
        return f"Command: `{commands[0]}`"
    return "Commands (each added cells): " + "; ".join(f"`{c}`" for c in commands)


def _seeds_note(summary: dict) -> str:
    """" Seeds in the cells: 0 (the command asks for 2)." where the cells hold other seeds than the command's."""
    held = sorted({s for rec in summary["recipes"].values() for s in rec["seeds"]})
    asked = summary["meta"].get("seeds")
    if asked is None or held == list(range(asked)):
        return ""
    return f" Seeds in the cells: {', '.join(map(str, held)) or 'none'} (the command asks for {asked})."


def render_markdown(summary: dict, agents: list[str]) -> str:
    meta = summary["meta"]
    sets = eval_sets_of(meta)
    held = (f"held-out: {meta['eval_size']} problems of the training distribution and the same problems in other "
            "words" if "words" in sets else
            f"held-out: {meta['eval_size']} instances of every environment, one episode each (won: reward 1)"
            if "before_reward" in summary else
            f"held-out: {meta['eval_size']} items of every trained task, and as many of every held-out task family")
    lines = ["# Collaboration benchmark", "", command_line(meta), "",
             f"Pair: {meta['pair']} ({', '.join(f'{a} = {m}' for a, m in meta['models'].items())}); "
             f"{meta['steps']} steps of B = {meta['prompts_per_step']} prompts × G = {meta['samples_per_prompt']}; "
             f"{held}; greedy avg@1, %, mean ± std over seeds; Δ vs GSPO: mean [95 % interval], paired by seed and "
             "problem (t on the seeds' degrees of freedom, two-way model: `hacrl_fed/report/stats.py`)."
             + _seeds_note(summary), ""]
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
    lines += _iqm_markdown(summary, agents)
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
