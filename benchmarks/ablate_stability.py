"""Base-model stability ablation: why does Gemma-3-270M lose held-out accuracy under isolated GSPO?

One agent (default ``gemma3`` of ``examples/default.toml``) trains alone with the ``gspo`` preset
(no KL) for ``--steps`` steps of B × G rollouts; each variant changes one thing. Held-out accuracy
(greedy avg@1) on the held-out split of the training distribution and on the same problems in other
words (:func:`hacrl_fed.data.arithmetic.reword`) before and after. Variants::

    base        lr 1e-5, full fine-tuning, AdamW steps even on a zero gradient (the old defaults)
    skip0       + no optimizer step on a mini-batch whose gradient is exactly zero
    frozen_emb  + token embedding / LM head frozen (skip0 too)
    lr1e-6      lr 1e-6 (skip0 too)
    lr3e-6      lr 3e-6 (skip0 too)

Resumable: each finished (variant, seed) cell is written to ``<out>/cells/<agent>-<variant>-s<seed>.json``
and skipped when present; ``<out>/results-<agent>.md`` summarizes them (``--summary-only`` rebuilds it)::

    python benchmarks/ablate_stability.py --out benchmarks/results/stability                       # gemma3
    python benchmarks/ablate_stability.py --agent smollm2 --seeds 1 --variants skip0,lr1e-6,lr3e-6 \
        --out benchmarks/results/stability
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from run_collab import accuracy  # noqa: E402  (the benchmarks' shared scoring of a {problem: correct} map)

VARIANTS = {
    "base": {"optim": {"lr": 1e-5, "skip_zero_grad_updates": False}, "train_embeddings": True},
    "frozen_emb": {"optim": {"lr": 1e-5, "skip_zero_grad_updates": True}, "train_embeddings": False},
    "lr1e-6": {"optim": {"lr": 1e-6, "skip_zero_grad_updates": True}, "train_embeddings": True},
    "skip0": {"optim": {"lr": 1e-5, "skip_zero_grad_updates": True}, "train_embeddings": True},
    "lr3e-6": {"optim": {"lr": 3e-6, "skip_zero_grad_updates": True}, "train_embeddings": True},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "default.toml")
    parser.add_argument("--agent", default="gemma3")
    parser.add_argument("--variants", default="base,frozen_emb,lr1e-6,skip0")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--eval-size", type=int, default=64)
    parser.add_argument("--algo", default="gspo")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "stability")
    parser.add_argument("--summary-only", action="store_true", help="rebuild results-<agent>.md from the cells")
    args = parser.parse_args(argv)
    if args.summary_only:
        summarize(args.out, args.agent)
        return 0

    from hacrl_fed.config import SimulateConfig, load_config
    from hacrl_fed.data.arithmetic import reword
    from inproc import Federation

    cfg = load_config(args.config, SimulateConfig)
    cfg.agents = [a for a in cfg.agents if a.name == args.agent]
    cfg.run.data.eval_size = args.eval_size
    out = args.out
    (out / "cells").mkdir(parents=True, exist_ok=True)
    fed = Federation(cfg)
    held = list(fed.held_out)
    words = [reword(p) for p in held]
    before_path = out / f"before-{args.agent}.json"
    if before_path.exists():
        before = json.loads(before_path.read_text())
    else:
        t = time.perf_counter()
        before = {"held_out": fed.evaluate(held)[args.agent], "words": fed.evaluate(words)[args.agent],
                  "eval_s": time.perf_counter() - t}
        before_path.write_text(json.dumps(before, indent=1))
    print(f"before: held-out {accuracy(before['held_out']):.3f}, words {accuracy(before['words']):.3f}", flush=True)
    for seed in range(args.seeds):
        for name in args.variants.split(","):
            cell = out / "cells" / f"{args.agent}-{name}-s{seed}.json"
            if cell.exists():
                continue
            v = VARIANTS[name]
            fed.reset(algo={"name": args.algo, "kl_coef": 0.0}, optim=v["optim"] | {"seed": seed},
                      train_embeddings=v["train_embeddings"])
            t0 = time.perf_counter()
            steps = fed.run(run_id=f"stab-s{seed}", steps=args.steps, seed=seed)
            t1 = time.perf_counter()
            after = {"held_out": fed.evaluate(held)[args.agent], "words": fed.evaluate(words)[args.agent]}
            t2 = time.perf_counter()
            rec = {"variant": name, "seed": seed, "steps": args.steps, "algo": args.algo, **v,
                   "after": after, "train_s": t1 - t0, "eval_s": t2 - t1,
                   "per_step": [{"step": s.step, "accuracy": s.accuracy[args.agent],
                                 "generate_s": s.generate_s[args.agent], "train_s": s.train_s[args.agent],
                                 "generate": s.generate_metrics[args.agent],
                                 "metrics": s.reports[args.agent]["metrics"],
                                 "own": s.reports[args.agent]["per_source"].get(args.agent, {})} for s in steps]}
            cell.write_text(json.dumps(rec, indent=1))
            print(f"[{name} s{seed}] {t1 - t0:.0f}+{t2 - t1:.0f} s: held-out {accuracy(after['held_out']):.3f}, "
                  f"words {accuracy(after['words']):.3f}, rollout acc "
                  f"{[round(s.accuracy[args.agent], 2) for s in steps]}", flush=True)
    fed.close()
    summarize(out, args.agent)
    return 0


def summarize(out: Path, agent: str) -> None:
    before = json.loads((out / f"before-{agent}.json").read_text())
    cells = [json.loads(p.read_text()) for p in sorted((out / "cells").glob(f"{agent}-*.json"))]
    lines = ["| variant | seeds | held-out after | words after | rollout acc (last 3 steps) | "
             "updates skipped on a zero gradient / all | s per step |", "|---|---|---|---|---|---|---|"]
    for name in VARIANTS:
        cs = [c for c in cells if c["variant"] == name]
        if not cs:
            continue

        def ms(xs):
            return f"{100 * statistics.fmean(xs):.1f} ± {100 * statistics.stdev(xs):.1f}" if len(xs) > 1 else \
                f"{100 * xs[0]:.1f}"

        ho = [accuracy(c["after"]["held_out"]) for c in cs]
        wo = [accuracy(c["after"]["words"]) for c in cs]
        last = [statistics.fmean(s["accuracy"] for s in c["per_step"][-3:]) for c in cs]
        zg = sum(s["metrics"].get("zero_grad_updates", 0.0) for c in cs for s in c["per_step"])
        upd = sum(s["metrics"].get("updates", 0.0) for c in cs for s in c["per_step"])
        sps = statistics.fmean(c["train_s"] / c["steps"] for c in cs)
        skipped = f"{zg:.0f}/{upd:.0f}" if VARIANTS[name]["optim"]["skip_zero_grad_updates"] else \
            f"off (every one of {upd:.0f} stepped)"
        lines.append(f"| {name} | {len(cs)} | {ms(ho)} | {ms(wo)} | {ms(last)} | {skipped} | {sps:.0f} |")
    text = (f"# Stability ablation ({agent}, isolated)\n\nBefore: held-out {100 * accuracy(before['held_out']):.1f} %, "
            f"words {100 * accuracy(before['words']):.1f} %\n\n" + "\n".join(lines) + "\n")
    (out / f"results-{agent}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    raise SystemExit(main())
