"""Does a rollout engine change what the base models score? Greedy outcomes of every learner of a config under two
rollout engines, on the same held-out items, compared item by item (issue: generation throughput, "the greedy
accuracy of both base models on the task suite's held-out items is unchanged within noise").

Each engine loads the whole federation (:class:`inproc.Federation`, ``model.engine`` set for every learner) and
evaluates the held-out sets of :func:`collab.evaluation.eval_sets_for` exactly as the collaboration benchmark's
``before.json`` does (greedy, one response per item, the run's seed). Per learner and set: the accuracy under each
engine, the paired difference B − A with its t interval over the items (:func:`hacrl_fed.report.stats.items_analysis`:
a fixed model evaluated greedily has no seed term), the items right under one engine only, the share of
identical outcomes and the evaluation seconds.

``--before PATH`` reads engine A's outcomes from a collaboration benchmark's ``before.json`` made with engine A at
the same ``--eval-size`` (its ``meta.json`` beside it must name that engine, or none for ``hf``), instead of
evaluating again::

    python benchmarks/engine_agreement.py --pair tasks --eval-size 128 --engines hf ct2 \\
        --before benchmarks/results/collab-tasks-powered/before.json --out benchmarks/results/engine-agreement

Writes ``results.json`` and ``results.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from collab.evaluation import eval_sets_for, evaluate_sets  # noqa: E402
from collab.recipes import PAIRS  # noqa: E402
from collab.results import recorded_engines  # noqa: E402


def evaluate_with(cfg, engine: str, threads: int | None, options: dict | None = None) -> tuple[dict, float]:
    """(learner → set → {item id: outcome}, evaluation seconds) of every learner of ``cfg`` under ``engine`` (with
    ``options`` as every learner's ``model.engine_options`` when given)."""
    from inproc import Federation

    cfg = cfg.model_copy(deep=True)
    for agent in cfg.agents:
        agent.model.engine = engine
        if options is not None:
            agent.model.engine_options = dict(options)
    fed = Federation(cfg, threads=threads)
    try:
        eval_sets, evaluate, _ = eval_sets_for(fed, cfg, cfg.run.data.source == "reasoning_gym")
        t = time.perf_counter()
        outcomes, _ = evaluate_sets(fed, evaluate, eval_sets)
        return {a: outcomes[a] for a in fed.learners}, time.perf_counter() - t
    finally:
        fed.close()


def read_before(path: Path, engine: str) -> dict:
    """Learner → set → {item id: outcome} from a ``before.json`` made with ``engine`` (checked on its meta.json by
    :func:`collab.results.recorded_engines`; results from before engines were recorded, or without a meta.json,
    were made with ``hf``). Raises ``ValueError`` for another engine."""
    made = set((recorded_engines(path.parent / "meta.json", {"any": "hf"}) or {"any": "hf"}).values())
    if made != {engine}:
        raise ValueError(f"{path} was made with engine(s) {sorted(made)}, not {engine!r}")
    return json.loads(path.read_text())["agents"]


def compare(a: dict, b: dict) -> dict:
    """Per learner and set: accuracies, the paired difference B − A (points, t interval over items), items right
    under one engine only and the share of identical outcomes; items missing on either side are left out."""
    from hacrl_fed.report.stats import items_analysis

    out: dict = {}
    for agent, sets in a.items():
        for name, per_a in sets.items():
            per_b = b.get(agent, {}).get(name, {})
            ids = sorted(set(per_a) & set(per_b))
            if not ids:
                continue
            ra = [per_a[i] == "correct" for i in ids]
            rb = [per_b[i] == "correct" for i in ids]
            r = items_analysis([float(y) - float(x) for x, y in zip(ra, rb)])
            out.setdefault(agent, {})[name] = {
                "items": len(ids), "acc_a": 100 * sum(ra) / len(ids), "acc_b": 100 * sum(rb) / len(ids),
                "diff": 100 * r.mean, "low": 100 * r.low, "high": 100 * r.high, "mde": 100 * r.mde,
                "right_a_only": sum(x and not y for x, y in zip(ra, rb)),
                "right_b_only": sum(y and not x for x, y in zip(ra, rb)),
                "same_outcome": sum(per_a[i] == per_b[i] for i in ids) / len(ids)}
    return out


def render(result: dict) -> str:
    a, b = result["engines"]
    opts = f" (`{json.dumps(result['options_b'])}`)" if result.get("options_b") else ""
    lines = [f"# Greedy outcomes under `{a}` and `{b}`{opts}", "", f"Command: `{result['command']}`", "",
             f"Paired by item (B = `{b}` − A = `{a}`, points); interval: t on the items' m − 1 degrees of freedom "
             "(`hacrl_fed/report/stats.py`, `items_analysis`: a fixed model, no seed term). Evaluation seconds: "
             + ", ".join(f"`{e}` {s:.0f} s" if s is not None else f"`{e}` read from before.json"
                         for e, s in result["eval_s"].items()) + ".", "",
             f"| learner | set | items | {a} % | {b} % | {b} − {a} [95 % interval] | MDE | right under {a} only | "
             f"right under {b} only | same outcome |", "|---|---|---|---|---|---|---|---|---|---|"]
    for agent, sets in result["comparison"].items():
        for name, c in sets.items():
            lines.append(f"| {agent} | {name} | {c['items']} | {c['acc_a']:.1f} | {c['acc_b']:.1f} | "
                         f"{c['diff']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}] | {c['mde']:.1f} | "
                         f"{c['right_a_only']} | {c['right_b_only']} | {100 * c['same_outcome']:.1f} % |")
    return "\n".join(lines) + "\n"


def _cli() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", choices=sorted(PAIRS), default="tasks", help="base config (run_collab.py's pairs)")
    p.add_argument("--config", type=Path, help="base simulate config (overrides --pair)")
    p.add_argument("--eval-size", type=int, default=None, help="held-out items per task (default: the config's)")
    p.add_argument("--engines", nargs=2, metavar=("A", "B"), default=["hf", "ct2"])
    p.add_argument("--options-b", type=json.loads, default=None, metavar="JSON",
                   help="engine B's model.engine_options, e.g. '{\"compute_type\": \"float32\"}'")
    p.add_argument("--before", type=Path, help="engine A's outcomes from a before.json (see the module docstring)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out", type=Path, required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _cli()
    args = parser.parse_args(argv)
    from hacrl_fed.config import SimulateConfig, load_config
    from hacrl_fed.worker.engines import require_engine

    for engine in args.engines:
        try:
            require_engine(engine)
        except ImportError as err:
            parser.error(f"--engines: {err}")
    cfg = load_config(args.config or ROOT / PAIRS[args.pair], SimulateConfig)
    if args.eval_size is not None:
        if args.eval_size < 1:
            parser.error("--eval-size must be >= 1")
        cfg.run.data.eval_size = args.eval_size
    a, b = args.engines
    if args.before:
        try:
            outcomes_a, seconds_a = read_before(args.before, a), None
        except (OSError, ValueError, KeyError) as err:
            parser.error(f"--before: {err}")
    else:
        outcomes_a, seconds_a = evaluate_with(cfg, a, args.threads)
    if args.options_b is not None and not isinstance(args.options_b, dict):
        parser.error("--options-b must be a JSON object")
    outcomes_b, seconds_b = evaluate_with(cfg, b, args.threads, args.options_b)
    result = {"command": "python benchmarks/engine_agreement.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
              "engines": [a, b], "options_b": args.options_b, "eval_s": {a: seconds_a, b: seconds_b},
              "comparison": compare(outcomes_a, outcomes_b), "outcomes": {a: outcomes_a, b: outcomes_b}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    (args.out / "results.md").write_text(render(result))
    print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
