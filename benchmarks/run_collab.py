"""Collaboration benchmark: HACPO vs isolated GSPO vs GSPO×2 vs naive sharing, N seeds (ARCHITECTURE §7).

Every (recipe, seed) is one ``hacrl-fed simulate`` run (the production code path, as a subprocess)
of the same two agents on the same data; all agents of a run use the recipe. Held-out accuracy
(greedy avg@1, the same problems for every seed) is measured before and after training.

Equal rollout budget per prompt and agent (G = ``run.samples_per_prompt``):

* ``hacpo``   — each agent generates G, trains on its G and the peer's G (capability-aware, the paper);
* ``naive``   — the same pool, foreign rows used as if they were own (no capability weighting);
* ``gspo``    — isolated: each agent generates G and trains on its own G;
* ``gspo_x2`` — isolated with 2G own rollouts: the same number of training rows as HACPO (the
  ``gspo_x2`` preset: each agent generates 2G, trains on all of them and publishes the plan's G).

The mini-batch size is the base config's, so HACPO, naive and GSPO×2 take the same number of
optimizer updates per step. Seeds change the prompt sampler and the sampling seeds
(``run.seed``, ``optim.seed``); the held-out problems stay the same. All recipes of one seed
share the run id, from which the agents' sampling seeds derive.

Measured run (``benchmarks/results/collab-5step-3seed/``, 1 h 44 min on 2 CPU cores: 410–565 s per
run of 5 steps, ≈ 55–90 s per step)::

    python benchmarks/run_collab.py --seeds 3 --steps 5 --out benchmarks/results/collab-5step-3seed

Without ``--steps`` a run has 20 steps: ≈ 5–6 hours for 3 seeds on 2 CPU cores.

Plumbing check with the tiny local models (random weights, accuracy 0; ~2 min per run)::

    python benchmarks/run_collab.py --tiny --seeds 1 --steps 2

Writes ``benchmarks/results/collab-<time>/`` (or ``--out``): ``results.json``, ``results.md``,
``collab.png``, the per-run configs, logs and per-step metrics (``metrics/<recipe>-s<N>.jsonl`` and
``.report.md``), and the run directories ``runs/<recipe>/seed<N>/`` (git-ignored: exported models).
Re-running with the same ``--out`` skips runs that already have a report (an interrupted run
starts afresh).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ("hacpo", "gspo", "gspo_x2", "naive")
LABELS = {"hacpo": "HACPO", "gspo": "GSPO (isolated)", "gspo_x2": "GSPO×2 (isolated, 2G)", "naive": "naive sharing"}
PHASES = ("load_models_s", "eval_before_s", "steps_s", "steps.worker_generate_s", "steps.worker_train_s", "eval_after_s",
          "export_s", "total_s")


def variant(base, recipe: str, seed: int):
    """The SimulateConfig of one (recipe, seed) run."""
    from hacrl_fed.algo.config import AlgoConfig

    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose from {', '.join(RECIPES)}")
    cfg = base.model_copy(deep=True)
    cfg.run.seed = seed
    for agent in cfg.agents:
        agent.algo = AlgoConfig.preset(recipe, kl_coef=agent.algo.kl_coef)
        agent.optim.seed = seed
    return cfg


def run_one(cfg, recipe: str, seed: int, out: Path) -> dict:
    """One ``hacrl-fed simulate`` subprocess; returns its report (plus wall time and exit code).

    Every recipe's run of a seed has the same run id (``seed<N>``): the agents' sampling seeds
    derive from it, so runs with the same G draw the same first-step samples.
    """
    import tomli_w

    name, run_dir = f"{recipe}-s{seed}", out / "runs" / recipe / f"seed{seed}"
    if (run_dir / "report.json").exists():
        print(f"[{name}] already done: {run_dir}", flush=True)
        return json.loads((run_dir / "report.json").read_text()) | {"wall_s": None, "exit_code": 0}
    if run_dir.exists():  # an interrupted earlier attempt: start that run afresh
        import shutil

        shutil.rmtree(run_dir)
    (out / "configs").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    config = out / "configs" / f"{name}.toml"
    config.write_text(tomli_w.dumps(cfg.model_dump(mode="json", exclude_none=True)), encoding="utf-8")
    argv = [sys.executable, "-m", "hacrl_fed.cli", "simulate", "--config", str(config), "--output-dir",
            str(run_dir.parent), "--run-name", run_dir.name, "--no-progress"]
    print(f"[{name}] {' '.join(argv[1:])}", flush=True)
    t0 = time.monotonic()
    with open(out / "logs" / f"{name}.log", "w", encoding="utf-8") as log:
        code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, check=False,
                              env=dict(os.environ, COLUMNS="160")).returncode
    wall = time.monotonic() - t0
    if code != 0 or not (run_dir / "report.json").exists():
        print(f"[{name}] FAILED (exit code {code}); see {out / 'logs' / f'{name}.log'}", flush=True)
        return {"agents": {}, "phases": {}, "wall_s": wall, "exit_code": code}
    report = json.loads((run_dir / "report.json").read_text())
    (out / "metrics").mkdir(exist_ok=True)  # the small per-step record, kept beside the results (runs/ is ignored)
    for src, suffix in (("metrics.jsonl", ".jsonl"), ("report.md", ".report.md")):
        (out / "metrics" / f"{name}{suffix}").write_bytes((run_dir / src).read_bytes())
    accs = ", ".join(f"{n} {a['accuracy_before']:.3f}→{a['accuracy_after']:.3f}" for n, a in report["agents"].items()
                     if a["accuracy_before"] is not None and a["accuracy_after"] is not None)
    print(f"[{name}] {wall:.0f} s: {accs}", flush=True)
    return report | {"wall_s": wall, "exit_code": code}


def _stat(xs: list[float]) -> dict[str, float | int | None]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def aggregate(runs: dict[str, dict[int, dict]]) -> dict:
    """Per recipe and agent: before/after/Δ over seeds (mean, std, n); per recipe: mean seconds per phase."""
    out: dict[str, dict] = {}
    for recipe, by_seed in runs.items():
        agents = sorted({n for r in by_seed.values() for n in r.get("agents", {})})
        per_agent = {}
        for n in agents:
            rows = [r["agents"][n] for r in by_seed.values() if n in r.get("agents", {})]
            per_agent[n] = {k: _stat([a[f"accuracy_{k}"] for a in rows]) for k in ("before", "after", "delta")}
        phases = {p: _stat([r["phases"].get(p) for r in by_seed.values()])["mean"] for p in PHASES}
        out[recipe] = {"agents": per_agent, "phases": phases,
                       "failed_seeds": [s for s, r in by_seed.items() if r.get("exit_code")]}
    return out


def _pm(s: dict) -> str:
    if s["mean"] is None:
        return "-"
    return f"{100 * s['mean']:.1f} ± {100 * s['std']:.1f}" if s["n"] > 1 else f"{100 * s['mean']:.1f}"


def render_markdown(summary: dict, command: str, meta: dict) -> str:
    agents = sorted({n for r in summary.values() for n in r["agents"]})
    setup = (f"{meta['seeds']} seed(s), {meta['steps']} steps, B = {meta['prompts_per_step']}, "
             f"G = {meta['samples_per_prompt']}, held-out problems: {meta['eval_size']} (greedy avg@1, %, mean ± std "
             f"over seeds).")
    lines = ["# Collaboration benchmark", "", f"Command: `{command}`", "", setup, "",
             "| recipe | " + " | ".join(f"{n} before | {n} after | {n} Δ" for n in agents) + " | failed seeds |",
             "|---|" + "---|---|---|" * len(agents) + "---|"]
    for recipe, r in summary.items():
        cells = []
        for n in agents:
            a = r["agents"].get(n)
            cells += [_pm(a["before"]), _pm(a["after"]), _pm(a["delta"])] if a else ["-", "-", "-"]
        lines.append(f"| {LABELS.get(recipe, recipe)} | " + " | ".join(cells) + f" | {r['failed_seeds'] or '-'} |")
    lines += ["", "Mean seconds per phase:", "", "| recipe | " + " | ".join(PHASES) + " |",
              "|---|" + "---|" * len(PHASES)]
    for recipe, r in summary.items():
        lines.append(f"| {LABELS.get(recipe, recipe)} | "
                     + " | ".join("-" if r["phases"].get(p) is None else f"{r['phases'][p]:.0f}" for p in PHASES) + " |")
    lines += ["", "![after-training accuracy](collab.png)", ""]
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recipes = list(summary)
    agents = sorted({n for r in summary.values() for n in r["agents"]})
    fig, ax = plt.subplots(figsize=(2.5 + 2 * len(recipes), 4))
    width = 0.8 / max(1, len(agents))
    for i, n in enumerate(agents):
        xs = [k + i * width for k in range(len(recipes))]
        stats = [summary[r]["agents"].get(n, {}).get("after", {"mean": None, "std": None}) for r in recipes]
        ax.bar(xs, [s["mean"] or 0.0 for s in stats], width, yerr=[s["std"] or 0.0 for s in stats], capsize=3,
               label=f"{n} after")
        before = [summary[r]["agents"].get(n, {}).get("before", {"mean": None})["mean"] for r in recipes]
        ax.scatter(xs, [b if b is not None else float("nan") for b in before], marker="_", s=300, color="black",
                   zorder=3, label="before training" if i == 0 else None)
    ax.set_xticks([k + width * (len(agents) - 1) / 2 for k in range(len(recipes))], [LABELS.get(r, r) for r in recipes])
    ax.set_ylabel("held-out accuracy (greedy avg@1)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="base simulate config (default examples/default.toml; "
                        "with --tiny examples/tiny.toml)")
    parser.add_argument("--tiny", action="store_true", help="tiny local models: a plumbing check, not a result")
    parser.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated subset of {','.join(RECIPES)}")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, help="override run.steps (default: 20; --tiny: the tiny config's)")
    parser.add_argument("--eval-size", type=int, help="override run.data.eval_size")
    parser.add_argument("--out", type=Path, help="results directory (default benchmarks/results/collab-<time>)")
    args = parser.parse_args(argv)

    from hacrl_fed.config import SimulateConfig, load_config

    base = load_config(args.config or ROOT / "examples" / ("tiny.toml" if args.tiny else "default.toml"), SimulateConfig)
    if args.steps or not args.tiny:
        base.run.steps = args.steps or 20
    if args.eval_size:
        base.run.data.eval_size = args.eval_size
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    out = (args.out or ROOT / "benchmarks" / "results" / f"collab-{datetime.now():%Y%m%d-%H%M%S}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    runs: dict[str, dict[int, dict]] = {r: {} for r in recipes}
    for s in range(args.seeds):  # seed-major: an interrupted benchmark leaves every recipe with the same seeds
        for r in recipes:
            runs[r][s] = run_one(variant(base, r, s), r, s, out)
    summary = aggregate(runs)
    meta = {"seeds": args.seeds, "steps": base.run.steps, "prompts_per_step": base.run.prompts_per_step,
            "samples_per_prompt": base.run.samples_per_prompt, "eval_size": base.run.data.eval_size,
            "models": {a.name: a.model.name_or_path for a in base.agents}, "wall_s": time.monotonic() - t0}
    command = "python benchmarks/run_collab.py " + " ".join(argv if argv is not None else sys.argv[1:])
    keep = ("run_dir", "exit_code", "wall_s", "agents", "phases")
    per_run = {r: {str(s): {k: v.get(k) for k in keep} for s, v in by.items()} for r, by in runs.items()}
    (out / "results.json").write_text(json.dumps({"command": command, "meta": meta, "summary": summary,
                                                  "runs": per_run}, indent=1), encoding="utf-8")
    (out / "results.md").write_text(render_markdown(summary, command.strip(), meta), encoding="utf-8")
    plot(summary, out / "collab.png")
    print(f"results: {out / 'results.md'} ({meta['wall_s']:.0f} s)")
    return 1 if any(r["failed_seeds"] for r in summary.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
