"""Asynchronous against synchronous rounds with one site made 3× slower (docs/async.md).

Runs ``hacrl-fed simulate`` twice per seed (``--seeds``: ``run.seed``) on one config (default
``examples/async.toml``: three SmolLM2-135M-Instruct sites on the task suite, ``smollm2-slow`` with
``agent.slowdown = 3``): once as written (``run.mode = "async"``) and once with ``run.mode = "sync"`` (everything
else equal; sync runs ``run.steps`` steps, async runs until every site made ``run.steps`` updates with
``async_steps = "slowest"``). Each run is one cell, ``<out>/cells/<mode>-s<seed>.json``, taken
from its ``metrics.jsonl`` and skipped when present (commit them as they come). Then, per site:

* updates per hour (own updates over the time from the run's start to its last update);
* held-out accuracy (greedy avg@1 over every held-out problem, trained tasks' items and task families alike)
  after the same number of own updates (``run.steps``) and after the same wall time (the sync run's training
  time: the site's last evaluation at or before it);
* the staleness histogram of the peer rows trained on (async: rows per staleness in source updates) and the
  share of peer rows dropped as stale.

The two runs go one after the other on the same machine: the wall times are comparable only when nothing else
runs (pause other benchmarks). ``--summary-only`` rebuilds ``results.md`` / ``results.json`` from the cells.

    python benchmarks/async_vs_sync.py --seeds 0,1 --out benchmarks/results/async-vs-sync
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("sync", "async")


def mode_config(config: Path, mode: str, seed: int, out: Path) -> Path:
    """``config`` with ``run.mode`` set to ``mode`` and ``run.seed`` to ``seed`` (the file must say
    ``mode = "async"`` and ``seed = <n>`` once each, at the start of a line)."""
    text = config.read_text(encoding="utf-8")
    line = 'mode = "async"'
    if text.count(line) != 1:
        raise SystemExit(f"{config}: expected exactly one line {line!r} in [run]")
    seeds = re.findall(r"(?m)^seed = \d+", text)
    if len(seeds) != 1:
        raise SystemExit(f"{config}: expected exactly one line 'seed = <n>' in [run]")
    path = out / f"{mode}-s{seed}.toml"
    text = re.sub(r"(?m)^seed = \d+", f"seed = {seed}", text.replace(line, f'mode = "{mode}"'))
    path.write_text(text, encoding="utf-8")
    return path


def run_cell(config: Path, mode: str, seed: int, out: Path) -> dict:
    """One simulate run in ``mode`` with ``run.seed = seed``; returns its cell (:func:`cell_from_metrics`)."""
    cfg = mode_config(config, mode, seed, out)
    runs = out / "runs"
    tag = f"{mode}-s{seed}"
    name = f"{tag}-{time.strftime('%Y%m%d-%H%M%S')}"
    cmd = [sys.executable, "-m", "hacrl_fed.cli", "simulate", "--config", str(cfg), "--output-dir", str(runs),
           "--run-name", name, "--no-progress"]
    print(f"[{tag}] {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    with open(out / f"{tag}.log", "w", encoding="utf-8") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()).returncode
    if rc != 0:
        raise SystemExit(f"[{tag}] simulate failed (exit {rc}): see {out / f'{tag}.log'}")
    cell = cell_from_metrics(runs / name / "metrics.jsonl", mode)
    cell["command_s"], cell["seed"] = time.monotonic() - t0, seed
    return cell


def _accuracy(agent_metrics: dict) -> float | None:
    value = agent_metrics.get("avg@1")
    return float(value) if isinstance(value, int | float) else None


def cell_from_metrics(path: Path, mode: str) -> dict:
    """Per site: update times (seconds from the run's start), evaluations (own step, time, accuracy), peer rows by
    staleness and rows dropped; from one run's ``metrics.jsonl``."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    start = next(r["time"] for r in records if r.get("event") == "run_start")
    sites: dict[str, dict] = {}

    def site(name: str) -> dict:
        return sites.setdefault(name, {"updates": [], "evals": [], "staleness_rows": Counter(), "peer_rows": 0,
                                       "dropped_rows": 0})

    for r in records:
        event = r.get("event")
        if event == "update" and r.get("status") == "trained":
            s = site(r["agent"])
            s["updates"].append(r["time"] - start)
            s["staleness_rows"].update({int(k): v for k, v in r.get("staleness_rows", {}).items()})
            s["peer_rows"] += sum(r.get("peer_rows", {}).values())
            s["dropped_rows"] += sum(n for per in r.get("dropped_rows", {}).values() for n in per.values())
        elif event == "step":
            for name, a in r.get("agents", {}).items():
                if a.get("status") == "trained":
                    s = site(name)
                    s["updates"].append(r["time"] - start)
                    s["peer_rows"] += sum(m.get("rows", 0) for src, m in a.get("per_source", {}).items()
                                          if src != name)
        elif event == "eval":
            steps_done = r.get("step", 0)
            for name, m in r.get("agents", {}).items():
                if name.startswith("unverified@") or _accuracy(m) is None:
                    continue
                site(name)["evals"].append({"own_step": steps_done, "time": r.get("time", start) - start,
                                            "accuracy": _accuracy(m)})
    for s in sites.values():
        s["staleness_rows"] = {str(k): v for k, v in sorted(s["staleness_rows"].items())}
    return {"mode": mode, "sites": sites, "run_s": max((r.get("time", start) for r in records), default=start) - start}


def at_step(evals: list[dict], step: int) -> float | None:
    """Accuracy of the evaluation after exactly ``step`` own updates (None if there is none)."""
    return next((e["accuracy"] for e in evals if e["own_step"] == step), None)


def at_time(evals: list[dict], t: float) -> tuple[float | None, int | None]:
    """Accuracy and own step of the last evaluation at or before ``t`` seconds."""
    before = [e for e in evals if e["time"] <= t]
    return (before[-1]["accuracy"], before[-1]["own_step"]) if before else (None, None)


def summarize(cells: dict[str, dict], steps: int) -> tuple[str, dict]:
    sync, asyn = cells.get("sync"), cells.get("async")
    if sync is None or asyn is None:
        return "both cells are needed\n", {}
    horizon = sync["run_s"]   # the sync run's end: its last update and the evaluation after it
    rows, out = [], {"steps": steps, "sync_run_s": horizon, "async_run_s": asyn["run_s"], "sites": {}}
    fmt = lambda v: "–" if v is None else f"{100 * v:.1f} %"
    for name in sorted(set(sync["sites"]) | set(asyn["sites"])):
        entry = {}
        for mode, cell in (("sync", sync), ("async", asyn)):
            s = cell["sites"].get(name, {"updates": [], "evals": [], "staleness_rows": {}, "peer_rows": 0,
                                         "dropped_rows": 0})
            last = max(s["updates"], default=0.0)
            acc_t, step_t = at_time(s["evals"], horizon)
            entry[mode] = {"updates": len(s["updates"]), "updates_per_hour": 3600 * len(s["updates"]) / last if last
                           else None, "before": at_step(s["evals"], 0), "at_steps": at_step(s["evals"], steps),
                           "at_sync_time": acc_t, "own_step_at_sync_time": step_t,
                           "staleness_rows": s["staleness_rows"], "peer_rows": s["peer_rows"],
                           "dropped_rows": s["dropped_rows"],
                           "dropped_share": s["dropped_rows"] / (s["dropped_rows"] + s["peer_rows"])
                           if s["dropped_rows"] + s["peer_rows"] else None}
        out["sites"][name] = entry
        sy, asy = entry["sync"], entry["async"]
        uph = lambda v: "–" if v is None else f"{v:.0f}"
        rows.append(f"| {name} | {uph(sy['updates_per_hour'])} | {uph(asy['updates_per_hour'])} | {fmt(sy['before'])} "
                    f"| {fmt(sy['at_steps'])} | {fmt(asy['at_steps'])} | {fmt(sy['at_sync_time'])} "
                    f"| {fmt(asy['at_sync_time'])} (after {asy['own_step_at_sync_time']}) "
                    f"| {asy['staleness_rows'] or '–'} | {fmt(asy['dropped_share'])} |")
    md = [f"# Asynchronous vs synchronous rounds, one site 3× slower ({steps} steps)", "",
          f"T = the sync run's time from its start to its last evaluation ({horizon:.0f} s); the async run lasted "
          f"{asyn['run_s']:.0f} s (until the slow site made {steps} updates and the last evaluation). N = {steps} own "
          "updates. Accuracy: greedy avg@1 on every held-out problem (trained tasks' items and task families).", "",
          "| site | updates/h sync | updates/h async | before | sync after N | async after N | sync at T | "
          "async at T (own updates) | async staleness (rows) | async dropped |",
          "|---|---|---|---|---|---|---|---|---|---|", *rows, ""]
    return "\n".join(md), out


def summarize_seeds(by_seed: dict[int, dict[str, dict]], steps: int) -> tuple[str, dict]:
    """Per seed the table of :func:`summarize`, then the mean over the seeds with both cells of each site's updates
    per hour, accuracies and dropped share (staleness histograms summed)."""
    done = {seed: summarize(cells, steps) for seed, cells in sorted(by_seed.items())
            if "sync" in cells and "async" in cells}
    if not done:
        return "both cells of a seed are needed\n", {}
    data = {"steps": steps, "seeds": {str(seed): d for seed, (_, d) in done.items()}, "mean": {}}
    keys = ("updates_per_hour", "at_steps", "at_sync_time", "dropped_share")
    fmt = lambda v, pct: "–" if v is None else (f"{100 * v:.1f} %" if pct else f"{v:.0f}")
    rows = []
    for name in sorted({n for _, d in done.values() for n in d["sites"]}):
        entry = {}
        for mode in MODES:
            per = [d["sites"][name][mode] for _, d in done.values() if name in d["sites"]]
            entry[mode] = {k: _mean([p[k] for p in per]) for k in keys}
            entry[mode]["before"] = _mean([p["before"] for p in per])
            hist: Counter = Counter()
            for p in per:
                hist.update({int(k): v for k, v in p["staleness_rows"].items()})
            entry[mode]["staleness_rows"] = {str(k): v for k, v in sorted(hist.items())}
        data["mean"][name] = entry
        sy, asy = entry["sync"], entry["async"]
        rows.append(f"| {name} | {fmt(sy['updates_per_hour'], False)} | {fmt(asy['updates_per_hour'], False)} "
                    f"| {fmt(sy['before'], True)} | {fmt(sy['at_steps'], True)} | {fmt(asy['at_steps'], True)} "
                    f"| {fmt(sy['at_sync_time'], True)} | {fmt(asy['at_sync_time'], True)} "
                    f"| {asy['staleness_rows'] or '–'} | {fmt(asy['dropped_share'], True)} |")
    md = [f"# Asynchronous vs synchronous rounds, one site 3× slower ({steps} steps, seeds "
          f"{', '.join(str(s) for s in done)})", "",
          "## Mean over the seeds", "",
          "Each figure is the mean over the seeds of the per-seed figure below (staleness: rows summed).", "",
          "| site | updates/h sync | updates/h async | before | sync after N | async after N | sync at T | "
          "async at T | async staleness (rows) | async dropped |",
          "|---|---|---|---|---|---|---|---|---|---|", *rows, ""]
    for seed, (text, _) in done.items():
        md += [f"## Seed {seed}", "", *text.splitlines()[2:], ""]
    return "\n".join(md), data


def _mean(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "async.toml")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument("--seeds", default="0", help="run.seed values, comma-separated: a sync and an async cell each")
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args()
    (args.out / "cells").mkdir(parents=True, exist_ok=True)
    import tomllib

    steps = tomllib.loads(args.config.read_text(encoding="utf-8"))["run"]["steps"]
    modes = [m for m in args.modes.split(",") if m]
    if bad := [m for m in modes if m not in MODES]:
        raise SystemExit(f"unknown mode {bad[0]!r}; valid: {', '.join(MODES)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--seeds: comma-separated integers, not {args.seeds!r}") from None
    by_seed: dict[int, dict[str, dict]] = {}
    for seed in seeds:   # seed by seed, sync then async: the two modes of a seed run next to each other
        for mode in modes:
            path = args.out / "cells" / f"{mode}-s{seed}.json"
            if path.exists():
                by_seed.setdefault(seed, {})[mode] = json.loads(path.read_text(encoding="utf-8"))
                print(f"[{mode}-s{seed}] done already", flush=True)
                continue
            if args.summary_only:
                continue
            by_seed.setdefault(seed, {})[mode] = cell = run_cell(args.config, mode, seed, args.out)
            path.write_text(json.dumps(cell, indent=1) + "\n", encoding="utf-8")
    md, data = summarize_seeds(by_seed, steps)
    (args.out / "results.md").write_text(md + "\n", encoding="utf-8")
    (args.out / "results.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
