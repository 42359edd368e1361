"""Asynchronous against synchronous rounds with one site made 3× slower (docs/async.md).

Runs ``hacrl-fed simulate`` twice on one config (default ``examples/async.toml``: three SmolLM2-135M-Instruct sites
on the task suite, ``smollm2-slow`` with ``agent.slowdown = 3``): once as written (``run.mode = "async"``) and once
with ``run.mode = "sync"`` (everything else equal; sync runs ``run.steps`` steps, async runs until every site made
``run.steps`` updates with ``async_steps = "slowest"``). Each run is one cell, ``<out>/cells/<mode>.json``, taken
from its ``metrics.jsonl`` and skipped when present (commit them as they come). Then, per site:

* updates per hour (own updates over the time from the run's start to its last update);
* held-out accuracy (greedy avg@1 over every held-out problem, trained tasks' items and task families alike)
  after the same number of own updates (``run.steps``) and after the same wall time (the sync run's training
  time: the site's last evaluation at or before it);
* the staleness histogram of the peer rows trained on (async: rows per staleness in source updates) and the
  share of peer rows dropped as stale.

The two runs go one after the other on the same machine: the wall times are comparable only when nothing else
runs (pause other benchmarks). ``--summary-only`` rebuilds ``results.md`` / ``results.json`` from the cells.

    python benchmarks/async_vs_sync.py --out benchmarks/results/async-vs-sync
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("sync", "async")


def mode_config(config: Path, mode: str, out: Path) -> Path:
    """``config`` with ``run.mode`` set to ``mode`` (the file must say ``mode = "async"`` once)."""
    text = config.read_text(encoding="utf-8")
    line = 'mode = "async"'
    if text.count(line) != 1:
        raise SystemExit(f"{config}: expected exactly one line {line!r} in [run]")
    path = out / f"{mode}.toml"
    path.write_text(text.replace(line, f'mode = "{mode}"'), encoding="utf-8")
    return path


def run_cell(config: Path, mode: str, out: Path) -> dict:
    """One simulate run in ``mode``; returns its cell (:func:`cell_from_metrics`)."""
    cfg = mode_config(config, mode, out)
    runs = out / "runs"
    name = f"{mode}-{time.strftime('%Y%m%d-%H%M%S')}"
    cmd = [sys.executable, "-m", "hacrl_fed.cli", "simulate", "--config", str(cfg), "--output-dir", str(runs),
           "--run-name", name, "--no-progress"]
    print(f"[{mode}] {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    with open(out / f"{mode}.log", "w", encoding="utf-8") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()).returncode
    if rc != 0:
        raise SystemExit(f"[{mode}] simulate failed (exit {rc}): see {out / f'{mode}.log'}")
    cell = cell_from_metrics(runs / name / "metrics.jsonl", mode)
    cell["command_s"] = time.monotonic() - t0
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "async.toml")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args()
    (args.out / "cells").mkdir(parents=True, exist_ok=True)
    import tomllib

    steps = tomllib.loads(args.config.read_text(encoding="utf-8"))["run"]["steps"]
    cells: dict[str, dict] = {}
    for mode in [m for m in args.modes.split(",") if m]:
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
        path = args.out / "cells" / f"{mode}.json"
        if path.exists():
            cells[mode] = json.loads(path.read_text(encoding="utf-8"))
            print(f"[{mode}] done already", flush=True)
            continue
        if args.summary_only:
            continue
        cells[mode] = run_cell(args.config, mode, args.out)
        path.write_text(json.dumps(cells[mode], indent=1) + "\n", encoding="utf-8")
    md, data = summarize(cells, steps)
    (args.out / "results.md").write_text(md + "\n", encoding="utf-8")
    (args.out / "results.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
