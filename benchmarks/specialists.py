"""Specialists: sites whose models were first trained on different task subsets, then federated on the union.

The paper's state heterogeneity (the same model family at different training states, arXiv 2603.02604 §3) in its
cross-organization form: each site owns a model it trained on its own tasks. Three stages, each resumable (a stage
whose outputs exist is skipped), all on the production path:

1. ``specialize`` — per site, ``hacrl-fed simulate`` of that site alone, isolated GSPO on its subset of the union
   config's tasks (``--subset NAME=TASK,TASK``); the other tasks of the union become held-out evaluation tasks, so
   the run's report shows what specializing did on both halves. Its export (a plain Hugging Face directory) is the
   specialist. Then ``<out>/union.toml``: the union config with every site's model replaced by its export.
2. ``federate`` — ``hacrl-fed simulate --config <out>/union.toml`` (the config's recipe, e.g. the paper's
   ``hacpo``): the federated exports, for routing.
3. ``route`` — ``hacrl-fed route eval`` over the specialists' exports and over the federated ones, on the union's
   tasks: routing pays where models differ by task.

The contrasts (does each site gain on the *other* site's subset more than under isolated GSPO and GSPO×2?) come
from ``benchmarks/run_collab.py --config <out>/union.toml --recipes gspo,gspo_x2,hacpo …`` cells, read by
``--analyse``: per site and subset, accuracy before (the specialist) → after, and the paired differences with t
intervals on the seeds' degrees of freedom (``hacrl_fed.report.stats`` through ``collab.stats``).

Model directories go under ``--work`` (``runs/`` is not committed); what ``--out`` receives is small: the
specialization reports' per-task tables (``specialists.json``), ``union.toml``, the route results and the analysis.

    python benchmarks/specialists.py --config benchmarks/configs/tasks_specialists.toml \\
        --subset smollm2_a=chain_sum,basic_arithmetic --subset smollm2_b=products,decimal_chain_sum \\
        --steps 20 --work runs/specialists --out benchmarks/results/specialists
    python benchmarks/run_collab.py --config benchmarks/results/specialists/union.toml \\
        --recipes gspo,gspo_x2,hacpo --seeds 2 --steps 20 --out benchmarks/results/collab-specialists
    python benchmarks/specialists.py ... --stages federate,route
    python benchmarks/specialists.py --out benchmarks/results/specialists \\
        --analyse benchmarks/results/collab-specialists
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from hacrl_fed.launch.supervise import die_with_parent

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

STAGES = ("specialize", "federate", "route")
SPECIALIZE_ALGO = "gspo"
"""Each specialist trains alone: isolated GSPO, the project's single-agent baseline."""
FEDERATED = "federated"
"""The run name of the federation of the specialists (stage ``federate``) under ``<work>/runs``."""


def parse_subsets(values: list[str], agents: list[str], tasks: list[str]) -> dict[str, list[str]]:
    """``["a=t1,t2", "b=t3"]`` → ``{"a": ["t1", "t2"], "b": ["t3"]}``. Every agent of the config exactly once, each
    with at least one task of the config's ``tasks`` (by label), no task twice within a subset. Raises
    ``ValueError`` naming what is wrong."""
    out: dict[str, list[str]] = {}
    for v in values:
        name, sep, rest = v.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"--subset {v!r}: expected NAME=TASK[,TASK…]")
        if name not in agents:
            raise ValueError(f"--subset {v!r}: no agent {name!r} in the config (agents: {', '.join(agents)})")
        if name in out:
            raise ValueError(f"--subset: agent {name!r} given twice")
        subset = [t.strip() for t in rest.split(",") if t.strip()]
        if not subset:
            raise ValueError(f"--subset {v!r}: no task")
        if bad := [t for t in subset if t not in tasks]:
            raise ValueError(f"--subset {v!r}: {bad} not among the config's tasks ({', '.join(tasks)})")
        if len(set(subset)) != len(subset):
            raise ValueError(f"--subset {v!r}: a task given twice")
        out[name] = subset
    if missing := [a for a in agents if a not in out]:
        raise ValueError(f"--subset missing for agent(s) {missing}: every site is a specialist")
    return out


def task_label(task: dict) -> str:
    """A task entry's label (its name when it has none), as the config's ``run.data.tasks`` names it."""
    return task.get("label") or task["name"]


def specialist_config(union: dict, agent: str, subset: list[str], *, steps: int, seed: int) -> dict:
    """The single-site config of ``agent``'s specialization: the union config's run with ``subset`` as its trained
    tasks (``num_problems`` scaled to keep the union's items per task), the union's other tasks as held-out
    evaluation tasks before its own ``eval_tasks``, ``steps`` and ``seed``; the one agent (``min_agents`` 1), with
    isolated GSPO."""
    cfg = json.loads(json.dumps(union))           # deep copy of plain TOML data
    data = cfg["run"]["data"]
    tasks = data["tasks"]
    data["tasks"] = [t for t in tasks if task_label(t) in subset]
    data["eval_tasks"] = [t for t in tasks if task_label(t) not in subset] + list(data.get("eval_tasks", []))
    if "num_problems" in data:
        data["num_problems"] = max(1, round(data["num_problems"] * len(data["tasks"]) / len(tasks)))
    cfg["run"] |= {"steps": steps, "seed": seed, "run_id": f"specialist-{agent}", "checkpoint_every": 0,
                   "min_agents": 1}
    site = next(a for a in cfg["agents"] if a["name"] == agent)
    site["algo"] = {**site.get("algo", {}), "name": SPECIALIZE_ALGO}
    cfg["agents"] = [site]
    return cfg


def union_config(union: dict, exports: dict[str, str]) -> dict:
    """The union config with every site's ``model.name_or_path`` set to its export."""
    cfg = json.loads(json.dumps(union))
    for a in cfg["agents"]:
        a.setdefault("model", {})["name_or_path"] = exports[a["name"]]
    return cfg


def _write_toml(path: Path, cfg: dict, header: str) -> None:
    import tomli_w

    from hacrl_fed.atomic import atomic_write_text

    atomic_write_text(path, "".join(f"# {line}\n" for line in header.splitlines()) + tomli_w.dumps(cfg))


def _check(path: Path) -> None:
    """Validate a written simulate config the way ``hacrl-fed simulate`` will (raises on a bad one)."""
    from hacrl_fed.config import SimulateConfig, load_config

    load_config(path, SimulateConfig)


def _simulate(config: Path, runs: Path, name: str, threads: int | None) -> Path:
    """``hacrl-fed simulate`` into ``runs/name`` unless its exports exist; returns the run directory."""
    run_dir = runs / name
    cfg = tomllib.loads(config.read_text())
    if all((run_dir / a["name"] / "export" / "config.json").is_file() for a in cfg["agents"]):
        print(f"[{name}] exported already: {run_dir}", flush=True)
        return run_dir
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, "-m", "hacrl_fed.cli", "simulate", "--config", str(config), "--output-dir", str(runs),
           "--run-name", name, "--no-progress"]
    if run_dir.exists():                          # an unfinished run: go on from its checkpoints
        cmd = [sys.executable, "-m", "hacrl_fed.cli", "simulate", "--resume", str(run_dir), "--no-progress"]
    print(f"[{name}] {' '.join(cmd[2:])}", flush=True)
    subprocess.run(cmd, check=True, env=env, preexec_fn=die_with_parent)   # killed, even by SIGKILL: it stops too
    for a in cfg["agents"]:
        if not (run_dir / a["name"] / "export" / "config.json").is_file():
            raise RuntimeError(f"{run_dir}: no export of {a['name']} after the run (see {run_dir}/logs)")
    return run_dir


def _rel(path: Path) -> str:
    """``path`` relative to the current directory when inside it (configs resolve paths from there)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def specialize(args, union: dict, subsets: dict[str, list[str]]) -> dict[str, str]:
    """Stage 1: one specialist per site; writes ``<out>/specialists.json`` and ``<out>/union.toml``. Returns
    agent → export directory."""
    from hacrl_fed.atomic import atomic_write_text

    configs, runs = args.work / "configs", args.work / "runs"
    configs.mkdir(parents=True, exist_ok=True)
    exports: dict[str, str] = {}
    record: dict = {"command": args.command, "config": _rel(args.config), "steps": args.steps, "seed": args.seed,
                    "algo": SPECIALIZE_ALGO, "subsets": subsets, "specialists": {}}
    for agent, subset in subsets.items():
        path = configs / f"{agent}.toml"
        _write_toml(path, specialist_config(union, agent, subset, steps=args.steps, seed=args.seed),
                    f"{agent} alone ({SPECIALIZE_ALGO}) on {', '.join(subset)}: written by benchmarks/specialists.py")
        _check(path)
        run_dir = _simulate(path, runs, agent, args.threads)
        exports[agent] = _rel(run_dir / agent / "export")
        report = json.loads((run_dir / "report.json").read_text())
        record["specialists"][agent] = {"export": exports[agent], "tasks": report.get("tasks", {}),
                                        "wall_s": (report.get("phases") or {}).get("total_s")}
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "specialists.json", json.dumps(record, indent=1))
    _write_toml(out / "union.toml", union_config(union, exports),
                f"{_rel(args.config)} with every site's model its specialist's export (benchmarks/specialists.py;\n"
                f"the exports are under {_rel(args.work)}, made again by: {args.command})")
    _check(out / "union.toml")
    print(f"specialists: {exports}; union config: {out / 'union.toml'}", flush=True)
    return exports


def federate(args) -> dict[str, str]:
    """Stage 2: the specialists federated on the union (``<out>/union.toml``'s recipe); agent → federated export."""
    union = args.out / "union.toml"
    if not union.is_file():
        raise RuntimeError(f"{union}: run the specialize stage first")
    run_dir = _simulate(union, args.work / "runs", FEDERATED, args.threads)
    names = [a["name"] for a in tomllib.loads(union.read_text())["agents"]]
    return {a: _rel(run_dir / a / "export") for a in names}


def route(args, before: dict[str, str], after: dict[str, str] | None) -> None:
    """Stage 3: ``hacrl-fed route eval`` over the specialists (``<out>/route-specialists``) and, when federated,
    over the federated models (``<out>/route-federated``), on the union config's tasks."""
    for label, models in (("specialists", before), ("federated", after)):
        if not models:
            continue
        dest = args.out / f"route-{label}"
        if (dest / "route.json").is_file():
            print(f"[route {label}] done already: {dest}", flush=True)
            continue
        cmd = [sys.executable, "-m", "hacrl_fed.cli", "route", "eval", "--data", str(args.config), "--out", str(dest),
               *[x for a, p in models.items() for x in ("--model", f"{a}={p}")], "--engine", args.engine]
        print(f"[route {label}] {' '.join(cmd[2:])}", flush=True)
        subprocess.run(cmd, check=True, preexec_fn=die_with_parent)


def analyse(collab: Path, out: Path) -> str:
    """Per site and subset (its own, the other sites'): accuracy of the specialist (``before.json``) and after each
    recipe, and the paired differences ``hacpo − gspo`` and ``hacpo − gspo_x2`` with 95 % t intervals on the seeds'
    degrees of freedom and the MDE at the seeds and items run (points; benchmarks/preregistered/specialists.md).
    Writes ``<out>/analysis.md`` and ``analysis.json``; returns the markdown."""
    from collab.scoring import accuracy
    from collab.stats import paired

    from hacrl_fed.atomic import atomic_write_text

    spec = json.loads((out / "specialists.json").read_text())
    meta = json.loads((collab / "meta.json").read_text())
    before = json.loads((collab / "before.json").read_text())["agents"]
    cells = [json.loads(p.read_text()) for p in sorted((collab / "cells").glob("*.json"))]
    by: dict[str, list[dict]] = {}
    for c in cells:
        by.setdefault(c["recipe"], []).append(c)
    tasks_of: dict[str, str] = meta.get("tasks") or {}
    subsets: dict[str, list[str]] = spec["subsets"]
    collab_recipes = [r for r in by if r not in ("gspo", "gspo_x2")]
    rows, record = [], {"collab": str(collab), "subsets": subsets, "sites": {}}
    for agent in subsets:
        for side, names in (("own", subsets[agent]),
                            ("other", [t for a, s in subsets.items() if a != agent for t in s])):
            ids = {p for p, t in tasks_of.items() if t in names}
            entry: dict = {"tasks": names, "items": len(ids & set(before[agent]["held_out"])),
                           "specialist": accuracy(before[agent]["held_out"], ids)}
            for r, cs in sorted(by.items()):
                entry[r] = sum(accuracy(c["after"][agent]["held_out"], ids) for c in cs) / len(cs)
            for r in collab_recipes:
                for base in ("gspo", "gspo_x2"):
                    if base in by:
                        p = paired(by[r], by[base], agent, "held_out", only=ids)
                        entry[f"{r} - {base}"] = None if p is None else {
                            "mean": p.mean, "low": p.low, "high": p.high, "mde": p.mde, "seeds": p.n, "items": p.m}
            record["sites"].setdefault(agent, {})[side] = entry
            rows.append((agent, side, entry))
    recipes = sorted(by)
    contrasts = [f"{r} - {b}" for r in collab_recipes for b in ("gspo", "gspo_x2") if b in by]
    lines = ["# Specialists federated on the union", "",
             f"Cells: `{collab}` ({meta.get('command', '')}); specialists: `{spec['command']}`.", "",
             "Held-out accuracy on each site's own subset and on the other sites' subsets: the specialist (before), "
             "each recipe after (mean over seeds), and the paired differences in points with 95 % t intervals on "
             "the seeds' degrees of freedom (one seed: the mean only).", "",
             "| site | subset | items | specialist | " + " | ".join(recipes) + " | " + " | ".join(contrasts) + " |",
             "|" + "---|" * (4 + len(recipes) + len(contrasts))]
    for agent, side, e in rows:
        cells_txt = [f"{100 * e[r]:.1f} %" for r in recipes]
        diffs = []
        for k in contrasts:
            d = e.get(k)
            diffs.append("–" if d is None else f"{100 * d['mean']:+.1f}" + (
                f" [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}], MDE {100 * d['mde']:.1f}"
                if d["seeds"] > 1 else f" ({d['seeds']} seed)"))
        lines.append(f"| {agent} | {side}: {', '.join(e['tasks'])} | {e['items']} | {100 * e['specialist']:.1f} % | "
                     + " | ".join(cells_txt) + " | " + " | ".join(diffs) + " |")
    text = "\n".join(lines) + "\n"
    atomic_write_text(out / "analysis.md", text)
    atomic_write_text(out / "analysis.json", json.dumps(record, indent=1))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, help="the union: a task-suite simulate config with the sites")
    parser.add_argument("--subset", action="append", default=[], metavar="NAME=TASK,TASK",
                        help="a site's own tasks (labels of the config's run.data.tasks); once per site")
    parser.add_argument("--steps", type=int, default=20, help="specialization steps per site (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stages", default="specialize", help=f"comma-separated, of {', '.join(STAGES)}")
    parser.add_argument("--engine", default="auto", help="route eval's engine (default auto)")
    parser.add_argument("--threads", type=int, help="OMP threads per worker process")
    parser.add_argument("--work", type=Path, default=Path("runs/specialists"), help="run directories and exports")
    parser.add_argument("--out", type=Path, required=True, help="small results (committed)")
    parser.add_argument("--analyse", type=Path, metavar="COLLAB_DIR",
                        help="only analyse run_collab cells of the union config against --out's specialists")
    args = parser.parse_args(argv)
    args.command = "python benchmarks/specialists.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.analyse:
        for p in (args.out / "specialists.json", args.analyse / "meta.json", args.analyse / "before.json"):
            if not p.is_file():
                parser.error(f"{p}: no such file")
        print(analyse(args.analyse, args.out))
        return 0
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    if bad := [s for s in stages if s not in STAGES]:
        parser.error(f"unknown stage(s) {bad}; choose from {', '.join(STAGES)}")
    if args.config is None or not args.config.is_file():
        parser.error(f"--config {args.config}: no such file")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    union = tomllib.loads(args.config.read_text())
    agents = [a["name"] for a in union.get("agents", [])]
    tasks = [task_label(t) for t in union.get("run", {}).get("data", {}).get("tasks", [])]
    if len(agents) < 2 or len(tasks) < 2:
        parser.error(f"{args.config}: specialists need at least 2 agents and 2 tasks, got {len(agents)} and "
                     f"{len(tasks)}")
    try:
        subsets = parse_subsets(args.subset, agents, tasks)
    except ValueError as err:
        parser.error(str(err))
    exports = specialize(args, union, subsets)
    federated = federate(args) if "federate" in stages else None
    if "route" in stages:
        route(args, exports, federated)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
