"""The numbers of the collaboration benchmark: from the cells of a results directory, per recipe and agent the
accuracy over seeds, the paired differences (:mod:`collab.stats`), where the gradient came from, the contributor's
share, and per task the outcomes (:func:`summary_of`). Pure: no file is read or written here."""

from __future__ import annotations

import statistics

from collab.recipes import COLLABORATIVE, CONTRIB, CONTRIB_COUNTS, PAIRWISE_BASES, RECIPES, TWINS, base_recipe, \
    eval_sets_of, twin_with_contrib
from collab.scoring import OUTCOMES, accuracy, gain_kinds, has_rewards, mean_reward, outcome_mix, reward_of
from collab.stats import iqm_vs, paired_interval, paired_mde


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


def summary_of(meta: dict, before: dict, cells: list[dict]) -> dict:
    """The summary of one results directory (what ``results.json`` holds) from its ``meta.json`` (``meta``),
    ``before.json`` (``before``: ``{"agents": {agent: {eval set: {problem id: entry}}}}``) and cell records.

    Keys: ``meta``; ``before`` (agent → set → accuracy before training); ``recipes`` (recipe → :func:`_recipe`),
    the recipes in :data:`collab.recipes.RECIPES` order, each followed by its ``+contrib`` twin; and where they
    apply ``before_reward`` (episodes: mean reward), ``before_tasks`` / ``before_outcomes`` (task suites: per
    task accuracy and :func:`collab.scoring.outcome_mix`). Accuracies are fractions."""
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
    for r in recipes:
        summary["recipes"][r] = _recipe(r, by, before, agents, sets, ids_of)
    trained = {t: ids for t, ids in ids_of.items() if ids & set(next(iter(before["agents"].values()))["held_out"])}
    if trained and "gspo" in by:   # the second view: IQM over seeds × trained tasks, stratified bootstrap
        summary["iqm"] = {r: {a: {b: iqm_vs(by[r], by[b], a, "held_out", trained)
                                  for b in ("gspo", "gspo_x2") if b in by and b != r}
                              for a in agents} for r in recipes if r != "gspo"}
    return summary


def _recipe(r: str, by: dict, before: dict, agents: list[str], sets: tuple[str, ...], ids_of: dict) -> dict:
    """One recipe's summary: ``seeds``, per agent :func:`_agent`, seconds per cell (``cell_s`` = ``steps_s`` +
    ``eval_s``, means over seeds) and for a ``+contrib`` recipe the contributor (:func:`contributor_site`).
    ``by``: recipe → its cells sorted by seed; ``ids_of``: task → its problem ids (empty without tasks)."""
    rec: dict = {"seeds": [c["seed"] for c in by[r]], "agents": {}}
    for a in agents:
        rec["agents"][a] = _agent(r, by, before, a, sets, ids_of)
    rec["cell_s"] = statistics.fmean(c["train_s"] + c["eval_s"] for c in by[r])
    rec["steps_s"] = statistics.fmean(c["train_s"] for c in by[r])
    rec["eval_s"] = statistics.fmean(c["eval_s"] for c in by[r])
    if base_recipe(r) != r:
        rec["contributor"] = contributor_site(by[r])
    return rec


def _agent(r: str, by: dict, before: dict, a: str, sets: tuple[str, ...], ids_of: dict) -> dict:
    """Agent ``a`` under recipe ``r``: per evaluation set :func:`_eval_set`, per task :func:`_task` (task suites),
    :func:`own_gradient`, the peer rows' share with a gradient (overall, of the peer successes, per step), seconds
    per step, and for a ``+contrib`` recipe :func:`contributor_summary`."""
    ag: dict = {e: _eval_set(r, by, before, a, e) for e in sets}
    if ids_of:
        ag["tasks"] = {t: _task(r, by, a, sets, only) for t, only in ids_of.items()}
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
    return ag


def _eval_set(r: str, by: dict, before: dict, a: str, e: str) -> dict:
    """Agent ``a``'s accuracy on evaluation set ``e`` under recipe ``r``: ``mean``, ``std``, ``n``, ``per_seed``;
    the paired differences against GSPO (``vs_gspo``, ``mde_vs_gspo``), against :data:`PAIRWISE_BASES` and the
    recipe's twin (``vs``, ``mde_vs``: collaborative recipes; :mod:`collab.stats`), against the recipe without the contributor
    (``vs_without_contrib``) and, for a named option with the contributor, against its twin with the contributor
    (``vs_twin_with_contrib``, :func:`collab.recipes.twin_with_contrib`); the mean episode
    reward (``reward``, episodes) and the format / content gains (``gains``, task suites)."""
    xs = [accuracy(c["after"][a][e]) for c in by[r]]
    out: dict = {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
                 "n": len(xs), "per_seed": xs}
    if r != "gspo" and "gspo" in by:
        out["vs_gspo"] = paired_interval(by[r], by["gspo"], a, e)
        out["mde_vs_gspo"] = paired_mde(by[r], by["gspo"], a, e)
    if r in COLLABORATIVE:
        out["vs"] = {b: paired_interval(by[r], by[b], a, e) for b in (*PAIRWISE_BASES, TWINS.get(r))
                     if b in by and b != r}
        out["mde_vs"] = {b: paired_mde(by[r], by[b], a, e) for b in PAIRWISE_BASES if b in by and b != r}
    if base_recipe(r) != r and base_recipe(r) in by:
        out["vs_without_contrib"] = paired_interval(by[r], by[base_recipe(r)], a, e)
        out["mde_vs_without_contrib"] = paired_mde(by[r], by[base_recipe(r)], a, e)
    twin = twin_with_contrib(r)
    if twin in by:                       # the named option, both sides with the contributor
        out["vs_twin_with_contrib"] = paired_interval(by[r], by[twin], a, e)
        out["mde_vs_twin_with_contrib"] = paired_mde(by[r], by[twin], a, e)
    if all(has_rewards(c["after"][a][e]) for c in by[r]):
        xs = [mean_reward(c["after"][a][e]) for c in by[r]]
        out["reward"] = {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1
                         else 0.0, "n": len(xs), "per_seed": xs}
        if r != "gspo" and "gspo" in by:
            out["reward"]["vs_gspo"] = paired_interval(by[r], by["gspo"], a, e, value=reward_of)
    kinds = [gain_kinds(before["agents"][a][e], c["after"][a][e]) for c in by[r]]
    if all(kinds):
        out["gains"] = {k: statistics.fmean(x[k] for x in kinds) for k in kinds[0]}
    return out


def _task(r: str, by: dict, a: str, sets: tuple[str, ...], only: set[str]) -> dict:
    """Agent ``a`` under recipe ``r`` on one task (its problem ids ``only``): the evaluation ``set`` holding it,
    ``mean`` / ``per_seed`` accuracy, the mean ``outcomes`` mix, and paired differences against GSPO, GSPO×2 and,
    for a ``+contrib`` recipe, the recipe without the contributor (None where that recipe has no cells) and, for a
    named option with the contributor, its twin with the contributor (``vs_twin_with_contrib``, where it has cells)."""
    e = next(e for e in sets if only & set(by[r][0]["after"][a][e]))
    xs = [accuracy(c["after"][a][e], only) for c in by[r]]
    mixes = [outcome_mix(c["after"][a][e], only) for c in by[r]]
    out = {"set": e, "mean": statistics.fmean(xs), "per_seed": xs,
           "outcomes": {k: statistics.fmean(m[k] for m in mixes) for k in OUTCOMES} if all(mixes) else None,
           "vs_gspo": paired_interval(by[r], by["gspo"], a, e, only=only)
           if r != "gspo" and "gspo" in by else None,
           "vs_gspo_x2": paired_interval(by[r], by["gspo_x2"], a, e, only=only)
           if r not in ("gspo_x2",) and "gspo_x2" in by else None}
    if base_recipe(r) != r:
        base = by.get(base_recipe(r))
        out["vs_without_contrib"] = paired_interval(by[r], base, a, e, only=only) if base else None
    twin = twin_with_contrib(r)
    if twin in by:
        out["vs_twin_with_contrib"] = paired_interval(by[r], by[twin], a, e, only=only)
    return out
