"""The report of a simulated run: ``report.json``, ``report.md`` and ``plot.png`` in the run directory.

Built from the coordinator's ``metrics.jsonl`` (:mod:`hacrl_fed.coordinator.step_record`) plus what
the simulation measured around it (phase times, model load times, peak RSS, export directories).
Per agent it gives the held-out accuracy before and after training (greedy avg@1, the worker's
Evaluate RPC), the rollout-accuracy, capability P̂ and capability-ratio r_{j→k} curves, the
cross-agent importance-ratio and clip statistics per source, and the wire bytes per step next to
the size of the model's weights (what one FedAvg exchange would move).

Metric glossary (per step, per learner k and source j ≠ k; ``report.json`` → ``steps[].agents``):

* ``accuracy``: fraction of k's rollouts the coordinator verified correct (on episodes, the mean episode reward
  P_t, partial rewards included).
* ``episode``: k's generate metrics of an episode step without the ``episode/`` prefix (``turns_mean``,
  ``done_frac``, ``context_cut_frac``, docs/multi-turn.md); ``report.json`` → ``episodes`` sums them up per agent
  with the held-out mean reward before and after (:func:`episode_summary`).
* ``capability``: P̂_k, mean of k's last K per-step accuracies (hacpo-spec Eq. 9).
* ``ratios[j]``: r_{j→k} = clip(P̂_j / P̂_k) the learner trained with (Eq. 10; 1 during warm-up).
* ``cross[j].s_mean`` / ``s_min`` / ``s_max``: cross importance ratio s = exp(mean log π_k − mean log π_j,old)
  of j's rows under k before clipping (Eq. 11).
* ``cross[j].clip_low`` / ``clip_high``: fraction of j's rows with s below l_m / above 1 (Eqs. 13–14).
* ``cross[j].grad_frac``: fraction of j's rows that reached k's gradient (A ≠ 0 and the ratio term not
  clamped; the cross-family rules can keep rows outside the window). ``pos_adv_rows`` /
  ``pos_adv_grad_rows``: j's rows with A > 0 for k, and those of them with a gradient.
* ``cross[j].received``: j's rows that reached learner k (``screens[j].screen_rows`` where k screens, else
  ``rows`` + ``dropped_truncated``); ``rows`` are those k trained on, after its screens and truncation.
* ``peer_grad_frac`` (per agent): share of all peer rows the agent received over the run that reached its
  gradient; rows its screens or the truncation rule left out count as not reached.
* ``screens[j]``: what learner k's screens did to j's rows (:mod:`hacrl_fed.screen_config`): ``screen_rows``
  seen, ``screened_rows`` (cut or left out: ``screened_tail_cut`` / ``screened_tail_reject`` /
  ``screened_length`` / ``screened_likelihood``), ``screened_phrase_cut`` (trained with a phrase recurring
  across j's answers to different prompts cut out), ``screened_key_cut`` (trained with a key word cut out:
  a word the foreign rows carry over the run far more often than k writes it, :mod:`hacrl_fed.screens.keys`),
  ``quarantined_rows`` (not trained: j quarantined),
  ``coordinator_disagreements`` (rewards the coordinator gave that k's own verifier contradicts; k trains on
  its own verdict), ``claim_disagreements`` (j's own reward claims k's verifier contradicts), ``standing``
  (0 trusted, 1 down-weighted, 2 quarantined) and ``ll_per_byte`` (mean learner log-likelihood per byte).
* ``wire_bytes``: bytes of k's orders and replies on the Flower wire in that step (both phases).
* in ``metrics.jsonl`` (``agents.<k>.train``, the learner's raw metrics): ``entropy`` (mean token entropy of the
  policy over the trained response tokens, nats), ``lr`` (mean learning rate of the step's updates),
  ``masked_truncated_rows``, ``reward/<function>_mean`` (with ``reward_funcs``), ``loss``, ``grad_norm`` ….
* ``weight_bytes`` (per agent): size of the exported ``*.safetensors``; ``weights_per_wire`` = weight_bytes
  / mean wire bytes per step.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["build_report", "plot_report", "read_metrics", "render_markdown", "summary_table", "write_report"]

_SCREEN_KEYS = ("screen_rows", "screened_rows", "screened_out", "screened_tail_cut", "screened_tail_reject", "screened_length",
                "screened_likelihood", "screened_phrase_cut", "screened_key_cut", "quarantined_rows", "coordinator_disagreements", "claim_disagreements",
                "standing", "ll_per_byte")
_CROSS_KEYS = ("s_mean", "s_min", "s_max", "clip_low", "clip_high", "rows", "adv_abs_mean", "grad_frac",
               "pos_adv_rows", "pos_adv_grad_rows", "dropped_truncated", "screen_rows")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every JSON line of ``metrics.jsonl`` (blank lines skipped). Raises OSError, ValueError."""
    text = Path(path).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _mean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _weight_bytes(export_dir: str | None) -> int | None:
    if not export_dir or not Path(export_dir).is_dir():
        return None
    return sum(p.stat().st_size for p in Path(export_dir).glob("*.safetensors")) or None


def _step_entry(rec: Mapping[str, Any]) -> dict[str, Any]:
    agents = {}
    for name, a in rec.get("agents", {}).items():
        per_source = a.get("per_source") or {}
        train, gen = a.get("train") or {}, a.get("generate") or {}
        agents[name] = {
            "status": a.get("status"), "accuracy": a.get("accuracy"), "capability": a.get("capability"),
            "task_accuracy": dict(a.get("task_accuracy") or {}), "task_capability": dict(a.get("task_capability") or {}),
            "ratios": {j: m.get("capability_ratio") for j, m in sorted(per_source.items()) if j != name},
            "cross": {j: _cross_entry(m) for j, m in sorted(per_source.items()) if j != name},
            "screens": {j: {k: m[k] for k in _SCREEN_KEYS if k in m} for j, m in sorted(per_source.items())
                        if j != name and "screen_rows" in m},
            "refused": list(a.get("train_rejected") or []),
            "cross_lower_bound_first": train.get("cross_lower_bound_first"),
            "cross_lower_bound_last": train.get("cross_lower_bound_last"),
            "zero_variance_group_frac": train.get("zero_variance_group_frac"),
            "wire_bytes": (a.get("bytes_in") or 0) + (a.get("bytes_out") or 0),
            "generate_s": a.get("generate_s"), "train_s": a.get("train_s"),
            "rss_bytes": max([x for x in (gen.get("rss_bytes"), train.get("rss_bytes")) if x is not None], default=None),
            "reward_disagreements": a.get("reward_disagreements"),
            "episode": {k.removeprefix("episode/"): v for k, v in gen.items() if k.startswith("episode/")},
            "distill": _distill_entry(train),
        }
    return {"step": rec["step"], "trained": rec.get("trained"), "interrupted": bool(rec.get("interrupted")),
            "timing": rec.get("timing", {}), "agents": agents}


def _distill_entry(train: Mapping[str, Any]) -> dict[str, Any]:
    """Peer distillation in one update (``algo.peer_distill_coef`` > 0; docs/algorithm.md): λ_t, rows distilled,
    their mean NLL (nats per token) and rows per source; ``{}`` when the update reported none."""
    if "distill_coef" not in train:
        return {}
    return {"coef": train.get("distill_coef"), "rows": train.get("distill_rows"), "nll": train.get("distill_nll"),
            "per_source": {k.removeprefix("src/").removesuffix("/distill_rows"): v for k, v in sorted(train.items())
                           if k.startswith("src/") and k.endswith("/distill_rows")}}


def _update_step(rec: Mapping[str, Any], batch: Mapping[str, Any]) -> dict[str, Any]:
    """An asynchronous run's ``update`` line (docs/async.md) as a step line of one agent, with the accuracy and
    capability of ``batch`` (the agent's accepted ``batch`` line of the same plan, ``{}`` if none)."""
    agent = {"status": rec.get("status"), "accuracy": batch.get("accuracy"), "capability": batch.get("capability"),
             "task_accuracy": batch.get("task_accuracy"), "per_source": rec.get("per_source"), "train": rec.get("train"),
             "train_rejected": rec.get("train_rejected"), "bytes_in": rec.get("bytes_in"),
             "bytes_out": rec.get("bytes_out"), "train_s": rec.get("order_s")}
    return {"step": rec.get("plan"), "trained": rec.get("status") == "trained", "timing": {},   # per site: no step time
            "agents": {rec.get("agent"): agent}}


def _step_lines(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The step lines of a run: sync ``step`` lines as they are, an asynchronous run's ``update`` lines turned into
    one-agent step lines (:func:`_update_step`)."""
    batches: dict[tuple[Any, Any], Mapping[str, Any]] = {}
    out = []
    for r in records:
        if r.get("event") == "batch" and r.get("status") == "accepted":
            batches[(r.get("agent"), r.get("plan"))] = r
        elif r.get("event") == "update":
            out.append(_update_step(r, batches.get((r.get("agent"), r.get("plan")), {})))
        elif r.get("event") == "step":
            out.append(r)
    return out


def _cross_entry(m: Mapping[str, Any]) -> dict[str, Any]:
    """One source's cross statistics for one learner and step, with ``received`` (see the glossary)."""
    c = {k: m.get(k) for k in _CROSS_KEYS}
    if c["screen_rows"] is not None:           # the screens see every row that reached the learner
        c["received"] = c["screen_rows"]
    elif c["rows"] is None and c["dropped_truncated"] is None:
        c["received"] = None
    else:                                      # no screens: trained rows + rows cut by truncation
        c["received"] = (c["rows"] or 0.0) + (c["dropped_truncated"] or 0.0)
    return c


def _grad_rows(c: Mapping[str, Any]) -> float:
    """Rows of one source that reached the learner's gradient in one step (rows × grad_frac)."""
    return (c.get("rows") or 0.0) * (c.get("grad_frac") or 0.0)


def _eval_tasks(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {k[5:-9]: v for k, v in metrics.items() if k.startswith("task/") and k.endswith("/accuracy")}


def _evals(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{"step": r["step"], "eval_s": r.get("eval_s"), "prompts": r.get("prompts"),
             "agents": {n: m.get("avg@1") for n, m in r.get("agents", {}).items()},
             "reward_mean": {n: m["reward_mean"] for n, m in r.get("agents", {}).items() if "reward_mean" in m},
             "tasks": {n: t for n, m in r.get("agents", {}).items() if (t := _eval_tasks(m))},
             "errors": {n: m["error"] for n, m in r.get("agents", {}).items() if "error" in m}}
            for r in records if r.get("event") == "eval"]


def _phases(steps: Sequence[Mapping[str, Any]], evals: Sequence[Mapping[str, Any]],
            measured: Mapping[str, float]) -> dict[str, float | None]:
    def total(key: str) -> float:
        return sum(s["timing"].get(key) or 0.0 for s in steps)

    out: dict[str, float | None] = dict(measured)
    first, last = (evals[0], evals[-1]) if evals else ({}, {})
    out["eval_before_s"] = first.get("eval_s") if first.get("step") == 0 else None
    out["eval_after_s"] = last.get("eval_s") if len(evals) > 1 or last.get("step", 0) > 0 else None
    out["steps_s"] = total("step_s")
    for key in ("generate_s", "validate_s", "verify_s", "train_s", "worker_generate_s", "worker_train_s", "overhead_s"):
        out[f"steps.{key}"] = total(key)
    if "run_s" in measured:
        evals_s = sum(e.get("eval_s") or 0.0 for e in evals)
        out["run_other_s"] = max(0.0, measured["run_s"] - out["steps_s"] - evals_s)
    return out


def _before_after(evals: Sequence[Mapping[str, Any]], name: str, key: str) -> tuple[Any, Any]:
    """One agent's value in the evaluations' ``key`` map (``agents``: avg@1, ``reward_mean``) before training (the
    evaluation at step 0) and after (the last evaluation after training that has the agent: one per site in an
    asynchronous run, docs/async.md); None where there is none."""
    before = evals[0].get(key, {}).get(name) if evals and evals[0]["step"] == 0 else None
    after = next((e[key][name] for e in reversed(evals) if e["step"] > 0 and name in e.get(key, {})), None)
    return before, after


def _agent_summary(name: str, info: Mapping[str, Any], steps: Sequence[Mapping[str, Any]],
                   evals: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    mine = [s["agents"][name] for s in steps if name in s["agents"]]
    wire = _mean([m["wire_bytes"] for m in mine])
    weights = _weight_bytes(info.get("export_dir"))  # type: ignore[arg-type]
    before, after = _before_after(evals, name, "agents")
    rss = [m["rss_bytes"] for m in mine if m["rss_bytes"] is not None]
    return {
        **{k: info.get(k) for k in ("model", "device", "load_s", "export_dir", "export_error", "peak_rss_bytes")},
        "accuracy_before": before, "accuracy_after": after,
        "accuracy_delta": after - before if before is not None and after is not None else None,
        "steps_trained": sum(m["status"] == "trained" for m in mine),
        "final_capability": next((m["capability"] for m in reversed(mine) if m["capability"] is not None), None),
        "wire_bytes_per_step": wire, "weight_bytes": weights,
        "weights_per_wire": weights / wire if weights and wire else None,
        "max_step_rss_bytes": max(rss, default=None),
        "generate_s_mean": _mean([m["generate_s"] for m in mine]), "train_s_mean": _mean([m["train_s"] for m in mine]),
        "peer_grad_frac": _peer_grad_frac(mine),
    }


def _peer_grad_frac(mine: Sequence[Mapping[str, Any]]) -> float | None:
    """Rows the peers sent this learner over the run that reached its gradient, as a fraction of the rows it
    received (rows left out by its screens or by truncation count as not reached; None: no peer rows)."""
    received = sum(c.get("received") or 0.0 for m in mine for c in m["cross"].values())
    got = sum(_grad_rows(c) for m in mine for c in m["cross"].values())
    return got / received if received else None


def build_report(records: Sequence[Mapping[str, Any]], *, run_dir: str | Path, phases: Mapping[str, float],
                 agents: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The report as plain JSON types (pure: no I/O except the sizes of exported weight files)."""
    steps = [_step_entry(r) for r in _step_lines(records)]
    evals = _evals(records)
    end = next((r for r in reversed(records) if r.get("event") == "run_end"), {})
    names = sorted(set(agents) | {n for s in steps for n in s["agents"]})
    report = {
        "run_id": end.get("run_id") or next((r.get("run_id") for r in records if r.get("run_id")), None),
        "run_dir": str(run_dir), "steps_done": end.get("steps", len(steps)),
        "skipped_steps": end.get("skipped_steps"), "overhead_frac": end.get("overhead_frac"),
        "phases": _phases(steps, evals, phases),
        "agents": {n: _agent_summary(n, agents.get(n, {}), steps, evals) for n in names},
        "evals": evals, "steps": steps,
    }
    report["tasks"] = task_summary(report)
    report["episodes"] = episode_summary(report)
    return report


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _size(x: float | None) -> str:
    from hacrl_fed.report.formats import format_bytes

    return format_bytes(x)


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


SUMMARY_COLUMNS = ("agent", "model", "device", "held-out before", "after", "Δ", "peer rows with a gradient",
                   "final P̂", "wire / step", "weights", "weights / wire", "peak RSS", "load s")


def _summary_rows(report: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for name, a in report["agents"].items():
        delta = a["accuracy_delta"]
        rows.append([name, str(a.get("model")), str(a.get("device")), _pct(a["accuracy_before"]),
                     _pct(a["accuracy_after"]), "-" if delta is None else f"{100 * delta:+.1f} pt",
                     _pct(a.get("peer_grad_frac")), _f(a["final_capability"], ".3f"), _size(a["wire_bytes_per_step"]), _size(a["weight_bytes"]),
                     _f(a["weights_per_wire"], ",.0f") + ("×" if a["weights_per_wire"] else ""),
                     _size(a.get("peak_rss_bytes")), _f(a.get("load_s"), ".0f")])
    return rows


def summary_table(report: Mapping[str, Any]):
    """A rich Table with one row per agent (the table the CLI prints at the end; fits 80 columns)."""
    from rich import box
    from rich.table import Table

    phases = report["phases"]
    table = Table(title=f"run {report['run_id']}: {report['steps_done']} steps, {_f(phases.get('total_s'), '.0f')} s in all",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for i, col in enumerate(("agent", "before", "after", "Δ pt", "peer grad", "P̂", "wire/step", "ratio", "peak RSS")):
        table.add_column(col, justify="left" if i == 0 else "right")
    for name, a in report["agents"].items():
        delta = a["accuracy_delta"]
        table.add_row(name, _pct(a["accuracy_before"]), _pct(a["accuracy_after"]),
                      "-" if delta is None else f"{100 * delta:+.1f}", _pct(a.get("peer_grad_frac")),
                      _f(a["final_capability"], ".3f"), _size(a["wire_bytes_per_step"]),
                      _f(a["weights_per_wire"], ",.0f") + ("×" if a["weights_per_wire"] else ""),
                      _size(a.get("peak_rss_bytes")))
    table.caption = ("peer grad: share of the rollouts the peers sent that reached the agent's gradient; "
                     "ratio: weights / wire bytes per step")
    table.caption_justify = "left"
    return table


PHASES = {
    "setup_s": "run directory, keys, configs, import check",
    "load_models_s": "start the workers until every model is loaded (in parallel; SuperLink starts meanwhile)",
    "flower_start_s": "start the SuperNodes",
    "run_s": "`flwr run`: ServerApp start, evaluations and steps",
    "export_s": "Checkpoint EXPORT of every model",
    "total_s": "wall time of the command (without writing this report)",
    "eval_before_s": "held-out evaluation before training (coordinator view, all agents in parallel)",
    "eval_after_s": "held-out evaluation after training",
    "steps_s": "all training steps",
    "steps.generate_s": "coordinator's generate phase (a train order may also carry the next step's plan: "
                        "then that generation is in the train phase)",
    "steps.validate_s": "signature and schema validation at the coordinator",
    "steps.verify_s": "coordinator re-verification of every reward",
    "steps.train_s": "coordinator's train phase (all agents in parallel)",
    "steps.worker_generate_s": "generation + scoring + verification in the slowest worker (worker clock)",
    "steps.worker_train_s": "HACPO update in the slowest worker (worker clock)",
    "steps.overhead_s": "step time not spent in the slowest worker's generate/train or in re-verification",
    "run_other_s": "rest of the run: ServerApp start, waiting for nodes, Flower messaging outside the phases",
}
"""What each phase key of ``report.json`` ``phases`` measures (seconds)."""


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows), ""]


def _grad_share(c: Mapping[str, Any]) -> float | None:
    """Fraction of one source's received rows that reached the gradient in one step (None: none received)."""
    return _grad_rows(c) / c["received"] if c.get("received") else None


def _count(c: Mapping[str, Any]) -> str:
    """``got/received`` rows of one source in one step (``-`` when nothing was received)."""
    if not c.get("received"):
        return "-"
    return f"{_grad_rows(c):.0f}/{c['received']:.0f}"


def _md_steps(report: Mapping[str, Any]) -> list[str]:
    names = list(report["agents"])
    header = ["step", "step s", *(f"{n} acc / P̂" for n in names), "r(j→k)",
              "cross s mean (clip low/high, rows with a gradient / received)"]
    rows = []
    for s in report["steps"]:
        ratios, cross = [], []
        for k, a in s["agents"].items():
            ratios += [f"{j}→{k} {_f(r, '.2f')}" for j, r in a["ratios"].items()]
            cross += [f"{j}→{k} {_f(c['s_mean'], '.3f')} ({_pct(c['clip_low'])}/{_pct(c['clip_high'])}, "
                      f"{_count(c)})" for j, c in a["cross"].items()]
        accs = [f"{_pct(s['agents'][n]['accuracy'])} / {_f(s['agents'][n]['capability'], '.3f')}"
                if n in s["agents"] else "-" for n in names]
        rows.append([str(s["step"]), _f(s["timing"].get("step_s"), ".0f"), *accs, ", ".join(ratios) or "-",
                     ", ".join(cross) or "-"])
    return _md_table(header, rows)


def task_summary(report: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Per task and agent: held-out accuracy before and after (greedy), mean rollout accuracy over the steps and
    the last P̂(t) (``task_accuracy`` / ``task_capability`` of the step records). Empty for a single-task run."""
    evals = report["evals"]
    before = evals[0].get("tasks", {}) if evals and evals[0]["step"] == 0 else {}
    after = evals[-1].get("tasks", {}) if evals and evals[-1]["step"] > 0 else {}
    names = list(report["agents"])
    tasks = sorted({t for per in (*before.values(), *after.values()) for t in per}
                   | {t for s in report["steps"] for a in s["agents"].values() for t in a.get("task_accuracy") or {}})
    if len(tasks) < 2:
        return {}
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for t in tasks:
        for n in names:
            mine = [s["agents"][n] for s in report["steps"] if n in s["agents"]]
            out.setdefault(t, {})[n] = {
                "held_out_before": before.get(n, {}).get(t), "held_out_after": after.get(n, {}).get(t),
                "rollout_accuracy": _mean([m["task_accuracy"].get(t) for m in mine if m.get("task_accuracy")]),
                "final_capability": next((m["task_capability"][t] for m in reversed(mine)
                                          if t in (m.get("task_capability") or {})), None)}
    return out


def _md_tasks(report: Mapping[str, Any]) -> list[str]:
    per = report.get("tasks") or {}
    if not per:
        return []
    names = list(report["agents"])
    rows = [[t, *(f"{_pct(v[n]['held_out_before'])} → {_pct(v[n]['held_out_after'])}" for n in names),
             *(f"{_pct(v[n]['rollout_accuracy'])} / {_f(v[n]['final_capability'], '.3f')}" for n in names)]
            for t, v in per.items()]
    return ["## Per task", "", "Held-out greedy accuracy before → after per task (tasks only evaluated are held-out "
            "families), and the mean rollout accuracy over the steps / the last capability P̂(t) per task "
            "(`algo.capability_scope = \"task\"` trains with it).", "",
            *_md_table(["task", *(f"{n} held-out" for n in names), *(f"{n} rollouts / P̂(t)" for n in names)], rows)]


def episode_summary(report: Mapping[str, Any]) -> dict[str, dict[str, float | None]]:
    """Per agent of an episode run (docs/multi-turn.md): the held-out mean episode reward before and after
    (``reward_mean`` of the evaluations: a win is 1, a lost game its partial reward) and, over the steps, the
    mean of ``episode/turns_mean`` (agent turns per training episode) and ``episode/done_frac`` (share the
    environment ended). Empty for a run without episodes."""
    out: dict[str, dict[str, float | None]] = {}
    for n in report["agents"]:
        before, after = _before_after(report["evals"], n, "reward_mean")
        played = [s["agents"][n]["episode"] for s in report["steps"] if s["agents"].get(n, {}).get("episode")]
        if before is None and after is None and not played:
            continue
        out[n] = {"reward_before": before, "reward_after": after,
                  "turns_mean": _mean([p.get("turns_mean") for p in played]),
                  "done_frac": _mean([p.get("done_frac") for p in played])}
    return out


def _md_episodes(report: Mapping[str, Any]) -> list[str]:
    """The episode section of ``report.md`` (:func:`episode_summary`); empty for a run without episodes."""
    per = episode_summary(report)
    if not per:
        return []
    rows = [[n, f"{_f(_scaled(v['reward_before']))} → {_f(_scaled(v['reward_after']))}", _f(v["turns_mean"]),
             _pct(v["done_frac"])] for n, v in per.items()]
    return ["## Episodes", "", "Held-out: greedy, one episode per instance; \"before\" / \"after\" above are the share "
            "won, the mean reward here counts a lost game's partial reward (×100). In the steps table `acc` is the "
            "mean reward of the step's episodes (P_t), partial rewards included. Turns: agent turns per training "
            "episode, mean over the steps; ended: the share the game ended (the rest stopped at `max_turns` or "
            "`model.max_episode_tokens`).", "",
            *_md_table(["agent", "held-out mean reward before → after", "turns per episode", "ended by the game"],
                       rows)]


def _md_distill(report: Mapping[str, Any]) -> list[str]:
    """The peer-distillation section of ``report.md``: per step and learner, λ_t, the rows distilled (by source)
    and their mean NLL; empty for a run without it."""
    rows = []
    for s in report["steps"]:
        for k, a in s["agents"].items():
            d = a.get("distill") or {}
            if d:
                by_source = ", ".join(f"{j} {_f(n, '.0f')}" for j, n in d["per_source"].items()) or "-"
                rows.append([str(s["step"]), k, _f(d["coef"], ".3f"), _f(d["rows"], ".0f"), by_source,
                             _f(d["nll"] if d["rows"] else None, ".3f")])
    if not rows:
        return []
    return ["## Peer distillation", "", "Per update: λ_t (`distill_coef`), the verified peer successes distilled "
            "(`distill_rows`, summed over the update's mini-batches; by source) and their mean NLL under the learner "
            "(`distill_nll`, nats per token; `-` when none); docs/algorithm.md, \"Peer distillation (named extension)\".", "",
            *_md_table(["step", "learner", "λ_t", "rows distilled", "by source", "mean NLL"], rows)]


def _scaled(x: float | None) -> float | None:
    return None if x is None else 100 * x


def _md_screens(report: Mapping[str, Any]) -> list[str]:
    """Per learner and source over the run: rows seen, screened by reason, disagreements, last standing."""
    total: dict[tuple[str, str], dict[str, float]] = {}
    for s in report["steps"]:
        for k, a in s["agents"].items():
            for j, m in (a.get("screens") or {}).items():
                t = total.setdefault((k, j), {})
                for key, value in m.items():
                    if key in ("standing", "ll_per_byte"):
                        t[key] = value
                    elif value is not None:
                        t[key] = t.get(key, 0.0) + value
    if not total:
        return []
    standing = {0.0: "trusted", 1.0: "down-weighted", 2.0: "quarantined"}
    rows = [[f"{j}→{k}", _f(t.get("screen_rows"), ".0f"), _f(t.get("screened_tail_cut"), ".0f"),
             _f(t.get("screened_tail_reject"), ".0f"), _f(t.get("screened_length"), ".0f"),
             _f(t.get("screened_likelihood"), ".0f"), _f(t.get("screened_phrase_cut"), ".0f"),
             _f(t.get("screened_key_cut"), ".0f"), _f(t.get("quarantined_rows"), ".0f"), _f(t.get("screened_out"), ".0f"),
             _f(t.get("coordinator_disagreements"), ".0f"), _f(t.get("claim_disagreements"), ".0f"),
             standing.get(t.get("standing"), "-")] for (k, j), t in sorted(total.items())]
    lines = ["## Screens", "", "What each learner's screens did to each source's rows over the run (metric glossary: "
             "`screens`); every screened row is a line of the worker's log with its reason.", ""]
    lines += _md_table(["source→learner", "rows", "tail cut", "tail rejected", "too long", "likelihood",
                        "phrase cut", "key cut", "quarantined rows", "left out", "coordinator disagreements", "claim disagreements", "last standing"], rows)
    refused = [f"* step {s['step']}, {k}: {line}" for s in report["steps"] for k, a in s["agents"].items()
               for line in a.get("refused") or [] if "quarantined by this site" in line]
    return lines + (refused[:20] + [""] if refused else [])


def render_markdown(report: Mapping[str, Any]) -> str:
    """``report.md``: summary, per-step curves as a table, where the time went, exported models."""
    lines = [f"# hacrl-fed simulate: {report['run_id']}", "",
             f"{report['steps_done']} steps ({report['skipped_steps'] or 0} skipped); run directory `{report['run_dir']}`.",
             "Held-out accuracy: greedy avg@1 through each worker's Evaluate RPC, before the first and after the last step.",
             "", "## Agents", ""]
    lines += _md_table(SUMMARY_COLUMNS, _summary_rows(report))
    lines += ["Wire bytes: each agent's orders and replies on the Flower wire per step (generate + train); weights:",
              "its exported safetensors, what one FedAvg exchange would move.", "", "## Steps", ""]
    lines += _md_steps(report)
    lines += _md_tasks(report)
    lines += _md_episodes(report)
    lines += _md_screens(report)
    lines += _md_distill(report)
    lines += ["## Where the time went", ""]
    lines += _md_table(["phase", "seconds", "what"], [[k, _f(v), PHASES.get(k, "")] for k, v in report["phases"].items()])
    lines += ["## Exported models", "", "Plain Hugging Face directories (`AutoModelForCausalLM.from_pretrained(dir)`); "
              "`hacrl_fed_prompt.json` in each says how it was prompted in training and where its answers stop "
              "(docs/simulate.md, \"Using an exported model\"):", ""]
    lines += [f"* {n}: `{a['export_dir']}`" if a.get("export_dir") else f"* {n}: not exported ({a.get('export_error') or 'the run did not complete'})"
              for n, a in report["agents"].items()]
    lines += ["", "![curves](plot.png)", ""]
    return "\n".join(lines)


def plot_report(report: Mapping[str, Any], path: str | Path) -> Path:
    """``plot.png``: rollout accuracy (+ held-out before/after), P̂, r_{j→k}, cross ratio, clip fraction, wire bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(2, 3, figsize=(15, 8))
    steps = report["steps"]
    windows: dict[tuple, list[str]] = {}   # learners sharing one clip window get one band
    for name, summary in report["agents"].items():
        xs = [s["step"] for s in steps if name in s["agents"]]
        mine = [s["agents"][name] for s in steps if name in s["agents"]]
        line = ax[0, 0].plot(xs, [m["accuracy"] for m in mine], marker="o", label=f"{name} rollouts")[0]
        held = [(e["step"], e["agents"].get(name)) for e in report["evals"] if e["agents"].get(name) is not None]
        if held:
            ax[0, 0].plot(*zip(*held), ls="--", marker="s", color=line.get_color(), label=f"{name} held-out")
        ax[0, 1].plot(xs, [m["capability"] for m in mine], marker="o", label=name, color=line.get_color())
        for t, style in zip(sorted({t for m in mine for t in m.get("task_capability") or {}}),
                            itertools.cycle((":", "-.", (0, (1, 3)), (0, (5, 2, 1, 2))))):
            pts = [(x, m["task_capability"][t]) for x, m in zip(xs, mine) if t in (m.get("task_capability") or {})]
            ax[0, 1].plot(*zip(*pts), ls=style, lw=1, color=line.get_color(), label=f"{name} P̂({t})")
        ax[1, 2].plot(xs, [m["wire_bytes"] for m in mine], marker="o", color=line.get_color(), label=f"{name} wire/step")
        if summary["weight_bytes"]:
            ax[1, 2].axhline(summary["weight_bytes"], ls="--", color=line.get_color(), label=f"{name} weights")
        for j in sorted({j for m in mine for j in m["ratios"]}):
            pts = [(x, m) for x, m in zip(xs, mine) if j in m["ratios"]]
            ax[0, 2].plot([x for x, _ in pts], [m["ratios"][j] for _, m in pts], marker="o", label=f"r({j}→{name})")
            s_line = ax[1, 0].plot([x for x, _ in pts], [m["cross"][j]["s_mean"] for _, m in pts], marker="o",
                                   label=f"{j}→{name} mean")[0]
            lows = [m["cross"][j]["s_min"] for _, m in pts]
            highs = [m["cross"][j]["s_max"] for _, m in pts]
            if all(v is not None for v in lows + highs):
                ax[1, 0].fill_between([x for x, _ in pts], lows, highs, color=s_line.get_color(), alpha=0.07)
            ax[1, 1].plot([x for x, _ in pts], [_grad_share(m["cross"][j]) for _, m in pts], marker="o",
                          label=f"{j}→{name}")
        bounds = [(x, m["cross_lower_bound_first"], m["cross_lower_bound_last"]) for x, m in zip(xs, mine)
                  if m.get("cross_lower_bound_first") is not None]
        if bounds:   # the clip window [l_m, 1] of the step's cross updates
            windows.setdefault(tuple(bounds), []).append(name)
    for (bounds, names), color in zip(windows.items(), itertools.cycle(("green", "olive", "teal", "purple"))):
        ax[1, 0].fill_between([b[0] for b in bounds], [b[1] for b in bounds], 1.0, color=color, alpha=0.25,
                              step="mid", label="clip window [l_m, 1]" + (f" ({', '.join(names)})" if len(windows) > 1 else ""))
    titles = ["accuracy (rollouts; held-out greedy dashed)", "capability P̂ (per task: thin lines)", "capability ratio r(j→k)",
              "cross ratio s (mean, min–max band; log scale)", "peer rows that reached the gradient (fraction of those received)",
              "bytes per step vs weights"]
    for a, title in zip(ax.flat, titles):
        a.set_title(title)
        a.set_xlabel("step")
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
        if a.has_data():
            a.legend(fontsize=7)
    for a in (ax[0, 0], ax[0, 1], ax[1, 1]):
        a.set_ylim(-0.03, 1.03)
    ax[1, 2].set_yscale("log")
    if ax[1, 0].has_data():
        ax[1, 0].set_yscale("log")   # a mean ratio of 5 000 must not flatten the window [l_m, 1]
        ax[1, 0].axhline(1.0, color="grey", lw=0.8)
    if ax[0, 2].has_data():
        ax[0, 2].set_yscale("log")  # r(j→k) is clipped to [0.1, 10] by default: symmetric on a log axis
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)


def _atomic_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def write_report(run_dir: str | Path, *, phases: Mapping[str, float],
                 agents: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Read ``<run_dir>/metrics.jsonl``; write ``report.json``, ``report.md`` and ``plot.png``. Returns the report."""
    d = Path(run_dir)
    report = build_report(read_metrics(d / "metrics.jsonl"), run_dir=d, phases=phases, agents=agents)
    plot_report(report, d / "plot.png")
    _atomic_text(d / "report.json", json.dumps(report, indent=1))
    _atomic_text(d / "report.md", render_markdown(report))
    return report
