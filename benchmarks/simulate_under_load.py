"""A whole ``hacrl-fed simulate`` run on a machine whose cores are taken by CPU burners.

What it measures (issue "Hardening 3", kind A): whether a run completes when every core is busy with other
jobs, and when Flower ends it, whether the operator is told the cause and how to resume, and whether the
resumed run finishes. For each burner count N (a cell):

1. start N ``python -c "while True: pass"`` processes (plain busy loops, no nice), and sample the load
   average every 5 s;
2. run ``hacrl-fed simulate --config CONFIG --no-progress`` into a fresh run directory, with a wall-clock
   limit;
3. if it exits non-zero, run ``hacrl-fed simulate --resume RUN_DIR`` under the same load, up to ``--resumes``
   times;
4. record per attempt: exit code, wall seconds, the steps the coordinator finished (``state.json``: ``step``
   and each agent's ``trained_steps``), the operator's cause lines (a run Flower ended, "run the same command
   to resume") and each site's "order ... not carried out" lines from the run's logs.

A cell is ``cells/burners-N.json``, written when it finishes and skipped on the next run (resumable);
``results.md`` is rebuilt from the cells. Usage::

    python benchmarks/simulate_under_load.py --config examples/tiny.toml --burners 0,8,16 \\
        --out benchmarks/results/simulate-under-load

The load average includes whatever else runs on the machine; the cell records it, so read a cell beside
the load it saw, not as a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CAUSE = re.compile(r"finished:failed|run the same command to resume|--resume|not carried out|withdrew|"
                   r"heartbeat|Traceback|error:", re.IGNORECASE)
"""Lines of the simulate output and of the run's logs that say why a step or the run was lost."""

MAX_LINES = 40
"""Cause lines kept per attempt (the first ones; the count of all is kept too)."""


def start_burners(n: int) -> list[subprocess.Popen]:
    """``n`` busy-loop processes at normal priority, each in its own session (as another user's job)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


class LoadSampler(threading.Thread):
    """The 1-minute load average every ``every`` seconds until :meth:`done`."""

    def __init__(self, every: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.every, self.samples, self._halt = every, [], threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def done(self) -> dict:
        self._halt.set()
        self.join()
        s = self.samples or [os.getloadavg()[0]]
        return {"load_mean": round(sum(s) / len(s), 1), "load_max": round(max(s), 1)}


def coordinator_record(run_dir: Path) -> dict:
    """Steps finished and each agent's trained steps from the coordinator's ``state.json`` ({} if none)."""
    path = run_dir / "coordinator" / "state.json"
    if not path.exists():
        return {"step": 0, "trained_steps": {}}
    state = json.loads(path.read_text())
    return {"step": state.get("step", 0), "trained_steps": state.get("trained_steps", {}),
            "restarts": state.get("restarts", 0)}


def log_causes(run_dir: Path) -> list[str]:
    """Every "not carried out" / withdrawn line in the run's logs, prefixed by the log's name."""
    found = []
    for log in sorted((run_dir / "logs").glob("*.log")) if (run_dir / "logs").exists() else []:
        for line in log.read_text(errors="replace").splitlines():
            if re.search(r"not carried out|withdrew", line, re.IGNORECASE):
                found.append(f"{log.name}: {line.strip()[:300]}")
    return found


def attempt(cmd: list[str], timeout: float, log_path: Path) -> dict:
    """Run one simulate command under the current load; its output goes to ``log_path``."""
    t = time.perf_counter()
    with log_path.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 15)
            try:
                rc = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                rc = proc.wait()
            rc = f"timeout after {timeout:.0f} s (then {rc})"
    wall = time.perf_counter() - t
    output = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    lines = [ln[:300] for ln in output if CAUSE.search(ln)]
    return {"command": " ".join(cmd[1:]), "rc": rc, "wall_s": round(wall, 1), "cause_lines": lines[:MAX_LINES],
            "cause_lines_total": len(lines), "last_line": output[-1][:300] if output else ""}


def with_steps(config: Path, steps: int | None, work: Path) -> Path:
    """``config``, or a copy in ``work`` whose ``[run] steps`` is ``steps`` (paths inside stay relative to the
    repository root, where simulate runs)."""
    if steps is None:
        return config
    text, n = re.subn(r"(?m)^steps\s*=\s*\d+", f"steps = {steps}", config.read_text(), count=1)
    if not n:
        raise SystemExit(f"--steps: {config} has no 'steps = N' line to change")
    copy = work / config.name
    copy.write_text(text)
    return copy


def run_cell(config: Path, burners: int, timeout: float, resumes: int, work: Path) -> dict:
    """One burner level: the first run and its resumes, each under ``burners`` busy loops."""
    exe = str(Path(sys.executable).with_name("hacrl-fed"))
    run_name = f"load-{burners}"
    run_dir = work / run_name
    procs = start_burners(burners)
    sampler = LoadSampler()
    sampler.start()
    attempts = []
    try:
        time.sleep(5 if burners else 0)   # the burners have the cores before the run starts
        cmd = [exe, "simulate", "--config", str(config), "--output-dir", str(work), "--run-name", run_name,
               "--no-progress"]
        for i in range(resumes + 1):
            rec = attempt(cmd, timeout, work / f"{run_name}-attempt{i}.log")
            rec.update(coordinator_record(run_dir))
            attempts.append(rec)
            print(f"[burners-{burners}] attempt {i}: rc {rec['rc']}, {rec['wall_s']:.0f} s, "
                  f"step {rec['step']}", flush=True)
            if rec["rc"] == 0:
                break
            cmd = [exe, "simulate", "--resume", str(run_dir), "--no-progress"]
    finally:
        load = sampler.done()
        stop(procs)
    return {"burners": burners, "cpus": os.cpu_count(), **load, "config": str(config),
            "completed": attempts[-1]["rc"] == 0, "attempts": attempts, "site_lines": log_causes(run_dir)}


def summarize(out: Path) -> str:
    cells = sorted((json.loads(p.read_text()) for p in (out / "cells").glob("burners-*.json")),
                   key=lambda c: c["burners"])
    meta = json.loads((out / "meta.json").read_text()) if (out / "meta.json").exists() else {}
    rows = ["# `hacrl-fed simulate` beside CPU burners", "",
            f"Command: `{meta.get('command', '')}`", "",
            "Burners: `python -c \"while True: pass\"`, each in its own session (its own scheduler autogroup, as "
            "another user's job). Each attempt runs under the same burners; a failed attempt is followed by "
            "`hacrl-fed simulate --resume RUN_DIR`. Steps = the coordinator's finished steps after the attempt.",
            "", "| burners | CPUs | load mean / max | attempt | exit | wall s | steps | operator's cause line | "
                "sites' not-carried-out lines |", "|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        for i, a in enumerate(c["attempts"]):
            cause = next((ln for ln in a["cause_lines"] if "resume" in ln.lower()), "") if a["rc"] != 0 else ""
            site = str(len(c["site_lines"])) if i == len(c["attempts"]) - 1 else ""
            rows.append(f"| {c['burners']} | {c['cpus']} | {c['load_mean']} / {c['load_max']} | {i} | {a['rc']} | "
                        f"{a['wall_s']:.0f} | {a['step']} | {cause.replace('|', '/')[:200]} | {site} |")
    text = "\n".join(rows) + "\n"
    (out / "results.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "tiny.toml")
    parser.add_argument("--burners", default="0,8,16", help="comma-separated burner counts, one cell each")
    parser.add_argument("--timeout", type=float, default=1800.0, help="wall-clock limit of one attempt (s)")
    parser.add_argument("--resumes", type=int, default=2, help="resume attempts after a failed run")
    parser.add_argument("--steps", type=int, help="override the config's run.steps")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if args.summary_only:
        print(summarize(out))
        return 0
    levels = [int(b) for b in args.burners.split(",") if b.strip()]
    if any(b < 0 for b in levels):
        parser.error("--burners: counts must be ≥ 0")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be ≥ 1")
    (out / "cells").mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/simulate_under_load.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (out / "meta.json").write_text(json.dumps({"command": command}, indent=1))
    config = args.config.resolve()
    for burners in levels:
        path = out / "cells" / f"burners-{burners}.json"
        if path.exists():
            print(f"[burners-{burners}] done already", flush=True)
            continue
        work = Path(tempfile.mkdtemp(prefix=f"sim-load-{burners}-"))
        try:
            cell = run_cell(with_steps(config, args.steps, work), burners, args.timeout, args.resumes, work)
        finally:
            logs = out / "logs" / f"burners-{burners}"
            logs.mkdir(parents=True, exist_ok=True)
            for f in work.glob("*.log"):
                shutil.copy(f, logs / f.name)
            shutil.rmtree(work, ignore_errors=True)
        cell.update(config=str(args.config), steps=args.steps)
        path.write_text(json.dumps(cell, indent=1))
        summarize(out)
    print(summarize(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
